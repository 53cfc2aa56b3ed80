"""What a study is run on: its backend, its workload and the facts about that workload
that decide whether a knob can matter."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.backends import get_backend
from tuner.core.errors import InputError
from tuner.serving.config import Deployment
from tuner.sim.model import load_model
from tuner.traffic.synth import article_mix, default_workload

if TYPE_CHECKING:
    from tuner.search.backend import Backend
    from tuner.space import SearchSpace, WorkloadSpec
    from tuner.traffic.workload import Workload


def get_backend_by_name(name: str, **options: Any) -> Backend:
    """``sim`` (default), ``vllm`` or ``endpoint`` (:func:`tuner.backends.get_backend`)."""

    return get_backend(name, **options)


def build_workload(spec: WorkloadSpec, deployment: Deployment | None = None) -> Workload:
    """The study's workload: the trace when given, else the built-in synthetic mix."""
    if spec.trace:
        from tuner.traffic import load_trace  # type: ignore[attr-defined]

        return load_trace(spec.trace)

    if spec.load == "trace":  # the trace axis compresses logged times: give it Poisson arrivals
        return article_mix(spec.requests, rate=spec.rate, seed=spec.seed)
    return default_workload(seed=spec.seed, n=spec.requests)


def num_heads(deployment: Deployment) -> int:

    return load_model(deployment.model).num_heads


def workload_file(space: SearchSpace, workload: Workload) -> str | None:
    """The file the study's requests were read from (absolute; a converted trace is its
    own source, never the log named inside it); None for a built-in mix or requests
    given in memory."""
    source = Path(str(workload.source or ""))
    return str(source.resolve()) if str(source) and source.is_file() else None


def workload_facts(workload: Workload) -> dict[str, Any]:
    """What decides whether a knob can matter for this workload: the longest request
    (prompt + output tokens) and whether requests share prefixes (repeated prefix hash ids,
    or conversations of more than one turn)."""
    longest = int((workload.prompt_tokens + workload.output_tokens).max()) if len(workload) else 0
    shares = False
    if workload.hash_ids is not None:
        seen: set[int] = set()
        for ids in workload.hash_ids:
            if ids and ids[0] in seen:
                shares = True
                break
            seen.update(ids[:1])
    if not shares and workload.turn is not None and len(workload.turn):
        shares = bool((workload.turn > 0).any())
    return {"workload_longest_tokens": longest, "workload_shares_prefixes": shares}


def longest_context(space: SearchSpace) -> int | None:
    """The most tokens (prompt + output) one request may hold under any configuration of
    ``space``: its largest max-model-len, the model's own where a configuration leaves it
    unset; None when the model cannot be read."""

    try:
        model_max = int(load_model(space.deployment.model).max_position_embeddings)
    except (InputError, OSError, ValueError):
        return None
    param = next((p for p in space.params if p.name == "max_model_len"), None)
    values = (list(param.choices) or [param.high]) if param is not None else [dict(space.fixed).get("max_model_len")]
    return max(model_max if v is None else int(v) for v in values)


def check_requests_fit(workload: Workload, space: SearchSpace) -> None:
    """:class:`InputError` naming the first request no configuration of ``space`` can serve
    (prompt + output beyond every max-model-len, :func:`longest_context`): vLLM would refuse it
    (HTTP 400) under every one, and every trial would fail on it."""
    import re

    import numpy as np

    limit = longest_context(space)
    if limit is None or not len(workload):
        return
    sizes = workload.prompt_tokens + workload.output_tokens
    over = np.flatnonzero(sizes > limit)
    if not len(over):
        return
    i = int(over[0])
    prompt, output = int(workload.prompt_tokens[i]), int(workload.output_tokens[i])
    path, line = workload.source, None
    source = Path(str(path))
    if source.is_file() and source.stat().st_size < 2**30:  # the line that holds it, when one does
        rx = re.compile(rf"(?<![\d.]){prompt}(?![\d.])")
        with open(source, encoding="utf-8", errors="replace") as fh:
            line = next((n for n, text in enumerate(fh, 1) if rx.search(text)), None)
    more = f" (and {len(over) - 1:,} more)" if len(over) > 1 else ""
    raise InputError(f"request {i + 1:,} of {len(workload):,} asks for {prompt:,} prompt + {output:,} output tokens, "
                     f"more than the longest max-model-len this space allows ({limit:,} tokens for "
                     f"{space.deployment.model}){more}: no configuration can serve it",
                     path=path if source.is_file() else None, line=line,
                     hint="drop the row, or allow a longer max_model_len in the space")

"""What a study is run on: its backend, its workload and the facts about that workload
that decide whether a knob can matter."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.serving.config import Deployment

if TYPE_CHECKING:
    from tuner.search.backend import Backend
    from tuner.space import SearchSpace, WorkloadSpec
    from tuner.traffic.workload import Workload

def get_backend_by_name(name: str, **options: Any) -> Backend:
    """``sim`` (default), ``vllm`` or ``endpoint`` (:func:`tuner.backends.get_backend`)."""
    from tuner.backends import get_backend

    return get_backend(name, **options)


def build_workload(spec: WorkloadSpec, deployment: Deployment | None = None) -> Workload:
    """The study's workload: the trace when given, else the built-in synthetic mix."""
    if spec.trace:
        from tuner.traffic import load_trace  # type: ignore[attr-defined]

        return load_trace(spec.trace)
    from tuner.traffic.synth import article_mix, default_workload

    if spec.load == "trace":  # the trace axis compresses logged times: give it Poisson arrivals
        return article_mix(spec.requests, rate=spec.rate, seed=spec.seed)
    return default_workload(seed=spec.seed, n=spec.requests)


def num_heads(deployment: Deployment) -> int:
    from tuner.sim.model import load_model

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

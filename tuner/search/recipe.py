"""A study's winner handed to deployment: a serve-params file (what ``vllm bench sweep
--serve-params`` reads: a list of flag objects, ``{"max_num_seqs": 256, ...}``, a ``true``
boolean is ``--flag`` and ``false`` is ``--no-flag``), the ``vllm serve`` command beside it,
and a note for each knob that changes what the model answers (an fp8 KV cache, quantised
weights), which a throughput search cannot see.

The parameters are read off the command's own flags (:func:`tuner.search.serve_command`),
so the file and the command never disagree. JSON is the format ``vllm bench sweep`` reads;
YAML holds the same list for people and deployment tools (``vllm bench sweep`` reads JSON only)."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError, TunerError
from tuner.core.files import write_atomic
from tuner.core.knobs import knob
from tuner.core.versions import parse_version
from tuner.search import serve_command
from tuner.sim.calibration import load_calibration
from tuner.sim.hardware import get_gpu

if TYPE_CHECKING:
    from tuner.serving.config import Deployment, ServeConfig

FORMATS = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def output_notes(deployment: Deployment, config: ServeConfig) -> list[str]:
    """One sentence per knob of the configuration that changes model outputs (not only speed)."""
    notes = []
    if config.kv_cache_dtype != "auto":
        notes.append(f"--kv-cache-dtype {config.kv_cache_dtype} stores the KV cache in 8 bits: answers change "
                     "slightly (usually a small accuracy loss); tuner measured speed only, so check accuracy on "
                     "your own task before deploying, or pin --kv-cache-dtype auto")
    if deployment.quantization:
        notes.append(f"--quantization {deployment.quantization}: the weights are quantised, so answers differ "
                     "from the unquantised model's; check accuracy on your own task")
    return notes


#: The share of the API server's own output tokens/s cap at which it, not the GPU, sets the pace.
FRONT_END_BOUND = 0.9


def front_end_cap(deployment: Deployment, config: ServeConfig) -> tuple[float, int, float] | None:
    """(seconds a token, API servers a replica, output tokens/s they can stream in all) for
    ``config``: the calibration's per-token front-end cost (the profile's, else the GPU class
    table's) shared by ``--api-server-count`` processes per replica; None where none is known."""

    try:  # a note, never a failure: a run on real vLLM may never have read its profile
        calib = load_calibration(get_gpu(deployment.gpu), deployment.calibration, vllm_version=deployment.vllm_version)
    except TunerError:
        return None
    per_token = float(getattr(calib, "frontend_per_token_s", 0.0) or 0.0)
    if per_token <= 0:
        return None
    servers = int(config.api_server_count or 1)
    return per_token, servers, config.replicas * servers / per_token


def front_end_note(deployment: Deployment, config: ServeConfig, output_tokens_per_s: float | None,
                   where: str, cap: tuple[float, int, float] | None = None) -> str | None:
    """A sentence where ``output_tokens_per_s`` (measured or simulated ``where``) reaches
    :data:`FRONT_END_BOUND` of what the API server processes can stream (``cap``, else
    :func:`front_end_cap`): there vLLM's front end, not the GPU, sets the pace, and
    ``--api-server-count`` shares it (benchmarks/h200/campaign6: four servers gave x1.18-1.21
    tokens/s at 256 decode-heavy users on an H100)."""

    if not output_tokens_per_s:
        return None
    cap = cap or front_end_cap(deployment, config)
    if cap is None or output_tokens_per_s < FRONT_END_BOUND * cap[2]:
        return None
    per_token, servers, limit = cap
    since = knob("api_server_count").since or "0"
    more = (f"--api-server-count {servers * 4} shares it (a free CPU core each)"
            if parse_version(deployment.vllm_version) >= parse_version(since)
            else f"vLLM {since} and later can run more of them (--api-server-count)")
    many = servers > 1
    return (f"{where} the API server{'s' * many} stream{'s' * (not many)} {output_tokens_per_s:,.0f} of the "
            f"{limit:,.0f} output tokens/s {'they' if many else 'it'} can ({per_token * 1e6:.0f} us a token, "
            f"{servers} a replica): the front end, not the GPU, sets the pace; {more}")


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def serve_params(deployment: Deployment, config: ServeConfig) -> dict[str, Any]:
    """The flags of ``config``'s ``vllm serve`` command (after the model) as one
    serve-params object: ``--max-num-seqs 256`` → ``"max_num_seqs": 256``, ``--enforce-eager``
    → ``true``, ``--no-enable-prefix-caching`` → ``"enable_prefix_caching": false``."""

    return _params_of(serve_command(deployment, config))


def _params_of(command: str) -> dict[str, Any]:
    """The flags of a ``vllm serve MODEL ...`` command line as one serve-params object."""
    argv = shlex.split(command)[3:]  # vllm serve MODEL
    params: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        flag = argv[i].removeprefix("--")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            params[flag.replace("-", "_")] = _value(argv[i + 1])
            i += 2
            continue
        if flag.startswith("no-"):
            params[flag.removeprefix("no-").replace("-", "_")] = False
        else:
            params[flag.replace("-", "_")] = True
        i += 1
    return params


def recipe_text(fmt: str, name: str, params: dict[str, Any], command: str, notes: list[str],
                header: list[str]) -> str:
    """The serve-params file in ``fmt`` (``json`` or ``yaml``): one entry named ``name``."""
    entry = {"_benchmark_name": name, **params}
    if fmt == "json":
        return json.dumps([entry], indent=2) + "\n"
    lines = [f"# {line}" for line in header]
    lines += ["# vllm serve command:", f"#   {command}"] + [f"# note: {n}" for n in notes]
    lines += ["# vllm bench sweep --serve-params reads JSON: write --recipe FILE.json for it"]
    for i, (key, value) in enumerate(entry.items()):
        lines.append(("- " if i == 0 else "  ") + f"{key}: {json.dumps(value)}")  # JSON scalars are YAML
    return "\n".join(lines) + "\n"


def write_recipe(path: str | Path, deployment: Deployment, config: ServeConfig, *, name: str,
                 header: list[str] = ()) -> list[Path]:
    """Write the serve-params file ``path`` (JSON or YAML by its extension) and the
    ``vllm serve`` command beside it (``path`` with ``.sh``: the command, with the ``header``
    lines and the :func:`output_notes` as comments); returns both paths."""

    target = Path(path)
    fmt = FORMATS.get(target.suffix.lower())
    if fmt is None:
        raise InputError(f"--recipe {path}: cannot tell the format from {target.suffix or 'no extension'!r}",
                         hint="end the name in .json (what vllm bench sweep --serve-params reads) or .yaml")
    command, notes = serve_command(deployment, config), output_notes(deployment, config)
    script = target.with_suffix(".sh")
    shell = ["#!/bin/sh", *(f"# {line}" for line in header), *(f"# note: {n}" for n in notes),
             f"# serve-params ({'for vllm bench sweep --serve-params' if fmt == 'json' else 'YAML'}): {target.name}",
             command]
    target.parent.mkdir(parents=True, exist_ok=True)
    written = [write_atomic(target, recipe_text(fmt, name, _params_of(command), command, notes,
                                                list(header)).encode("utf-8")),
               write_atomic(script, ("\n".join(shell) + "\n").encode("utf-8"))]
    return written


__all__ = ["FORMATS", "output_notes", "recipe_text", "serve_params", "write_recipe"]

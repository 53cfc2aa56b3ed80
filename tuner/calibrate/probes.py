"""Named, reproducible workloads and loads for calibration: what a measured load point
offered, written down so that the simulator can offer exactly the same later.

A *workload reference* is a small dict: ``{"kind": "prefill", "n": 64, "seed": 3}`` for a
synthetic shape, or ``{"kind": "trace", "trace": "azure_llm_2023_conv", "rows": [0, 400]}``
for rows of a shipped trace (``tuner/data/traces``, read from the installed package; the
reference carries the rows' fingerprint so a changed file is noticed). :func:`build` turns a reference into a
:class:`~tuner.traffic.workload.Workload`; :func:`load_spec` / :func:`load_from` do the
same for the :data:`tuner.serving.load.Load` it was offered under.

Synthetic shapes (lengths in tokens; outputs are forced, so they are exact):

* ``uniform``: prompts U(128, 1024), outputs U(32, 256) — the first calibration's rows.
* ``mix``: tuner's built-in 40/40/20 request mix (:func:`tuner.traffic.synth.default_workload`).
* ``prefill``: prompt-heavy, as a production RAG/code endpoint: prompts lognormal with
  mean ~2,100 and p95 ~6,900, outputs lognormal with mean ~24.
* ``decode``: short prompts U(64, 256), long outputs U(384, 768).
* ``long``: 16k-30k-token prompts, outputs U(64, 128).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from tuner.core.errors import InputError
from tuner.serving.load import Concurrency, Load, Poisson, TraceReplay
from tuner.traffic import load_trace
from tuner.traffic.synth import default_workload
from tuner.traffic.workload import Workload

#: Where the traces tuner ships live: inside the package (``tuner/data/traces``, with their sources and licences).
TRACES_DIR = Path(__file__).resolve().parents[1] / "data" / "traces"
TRACES = {
    "azure_llm_2023_conv": "azure_llm_2023_conv/AzureLLMInferenceTrace_conv.csv",
    "mooncake_fast25_synthetic": "mooncake_fast25_synthetic/synthetic_trace.jsonl",
}
SHAPES = ("uniform", "mix", "prefill", "decode", "long")


def _lognormal(rng: np.random.Generator, n: int, mean: float, p95: float, lo: int, hi: int) -> np.ndarray:
    """Lognormal draws with the given mean and 95th percentile, clipped to [lo, hi].
    mean = exp(mu + s^2/2), p95 = exp(mu + 1.645 s): s solves s^2/2 - 1.645 s + ln(p95/mean) = 0."""
    d = math.log(p95 / mean)
    s = 1.645 - math.sqrt(max(1.645**2 - 2 * d, 0.0))
    mu = math.log(mean) - s * s / 2
    return np.clip(np.round(rng.lognormal(mu, s, n)), lo, hi).astype(np.int64)


def synthetic(kind: str, n: int, seed: int = 0, offset: int = 0) -> Any:
    """Rows ``offset .. offset+n`` of one seeded sequence of shape ``kind``; arrivals 0."""

    if kind == "mix":
        w = default_workload(seed=seed, n=offset + n)
        return w.take(slice(offset, offset + n))
    rng = np.random.default_rng(seed)
    total = offset + n
    if kind == "uniform":
        prompts, outputs = rng.integers(128, 1025, total), rng.integers(32, 257, total)
    elif kind == "prefill":
        prompts = _lognormal(rng, total, 2100, 6900, 32, 15000)
        outputs = _lognormal(rng, total, 24, 60, 2, 128)
    elif kind == "decode":
        prompts, outputs = rng.integers(64, 257, total), rng.integers(384, 769, total)
    elif kind == "long":
        prompts, outputs = rng.integers(16000, 30001, total), rng.integers(64, 129, total)
    else:
        raise InputError(f"unknown workload shape {kind!r}", hint=f"use one of {', '.join(SHAPES)}")
    return Workload(arrival_s=np.zeros(n), prompt_tokens=prompts[offset:], output_tokens=outputs[offset:],
                    source=f"{kind}(seed={seed}, offset={offset})")


def trace_rows(trace: str, rows: tuple[int, int], *, max_tokens: int | None = None,
               folder: Path | None = None, groups: int | None = None) -> Any:
    """Rows ``[start, stop)`` of a shipped trace (after dropping requests longer than
    ``max_tokens`` prompt + output, when given), arrivals rebased to 0. With ``groups``,
    the rows are counted among the requests whose first prefix block is one of the
    ``groups`` most shared first blocks (ties by block id): a prefix-sharing subset."""

    rel = TRACES.get(trace)
    if rel is None:
        raise InputError(f"unknown trace {trace!r}", hint=f"known: {', '.join(TRACES)}")
    path = (folder or TRACES_DIR) / rel
    if not path.is_file():
        raise InputError(f"trace {trace!r} not found (the package's data/traces is incomplete: reinstall tuner)",
                         path=path)
    w = load_trace(path)
    if max_tokens is not None:
        keep = np.flatnonzero(w.prompt_tokens + w.output_tokens <= max_tokens)
        w = w.take(keep)
    if groups:
        import collections

        if w.hash_ids is None:
            raise InputError(f"trace {trace} has no prefix ids to group by")
        count = collections.Counter(h[0] for h in w.hash_ids if h)
        top = {b for b, _ in sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))[:groups]}
        w = w.take([i for i, h in enumerate(w.hash_ids) if h and h[0] in top])
    return w.take(slice(rows[0], rows[1]))


#: A folder of trace workloads written by :func:`cache_workload` (rows carried to a machine as built
#: workloads, such as a GPU host, so a probe needs no trace reading there).
CACHE_ENV = "TUNER_WORKLOAD_CACHE"


def build(ref: dict[str, Any], *, traces: Path | None = None) -> Any:
    """The workload a reference names (module docstring); a trace reference whose rows no
    longer match its stored fingerprint is refused. ``unique_prefixes`` drops the
    trace's prefix ids (every prompt its own: the same lengths without sharing)."""
    kind = ref.get("kind")
    if kind == "trace":
        w = _cached(ref) or trace_rows(ref["trace"], tuple(ref["rows"]), max_tokens=ref.get("max_tokens"),
                                       folder=traces, groups=ref.get("groups"))
        want = ref.get("fingerprint")
        if want and w.fingerprint() != want:
            raise InputError(f"trace {ref['trace']} rows {ref['rows']} changed (fingerprint {w.fingerprint()}, "
                             f"measured on {want})")
        if ref.get("unique_prefixes"):
            import dataclasses

            w = dataclasses.replace(w, hash_ids=None)
        return w
    return synthetic(str(kind), int(ref["n"]), seed=int(ref.get("seed", 0)), offset=int(ref.get("offset", 0)))


def cache_workload(ref: dict[str, Any], folder: Path) -> Path:
    """Write the rows of a trace reference to ``folder/<fingerprint>.json`` (read back by
    :func:`build` where :data:`CACHE_ENV` names the folder)."""
    import json

    w = trace_rows(ref["trace"], tuple(ref["rows"]), max_tokens=ref.get("max_tokens"), groups=ref.get("groups"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{w.fingerprint()}.json"
    path.write_text(json.dumps({"arrival_s": w.arrival_s.tolist(), "prompt_tokens": w.prompt_tokens.tolist(),
                                "output_tokens": w.output_tokens.tolist(), "block_tokens": w.block_tokens,
                                "hash_ids": None if w.hash_ids is None else [list(h) for h in w.hash_ids],
                                "source": w.source}))
    return path


def _cached(ref: dict[str, Any]) -> Any:
    import json
    import os

    folder = os.environ.get(CACHE_ENV)
    if not folder or not ref.get("fingerprint"):
        return None
    path = Path(folder) / f"{ref['fingerprint']}.json"
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    hashes = None if d.get("hash_ids") is None else [tuple(h) for h in d["hash_ids"]]
    return Workload(arrival_s=np.array(d["arrival_s"]), prompt_tokens=np.array(d["prompt_tokens"]),
                    output_tokens=np.array(d["output_tokens"]), hash_ids=hashes,
                    block_tokens=int(d.get("block_tokens", 512)), source=str(d.get("source", "cache")))


def ref_of(kind: str, n: int, *, seed: int = 0, offset: int = 0) -> dict[str, Any]:
    return {"kind": kind, "n": n, "seed": seed, "offset": offset}


def trace_ref(trace: str, rows: tuple[int, int], *, max_tokens: int | None = None, groups: int | None = None,
              unique_prefixes: bool = False, traces: Path | None = None) -> dict[str, Any]:
    """A trace reference with the fingerprint of the rows it names (read now)."""
    w = trace_rows(trace, rows, max_tokens=max_tokens, folder=traces, groups=groups)
    ref: dict[str, Any] = {"kind": "trace", "trace": trace, "rows": [rows[0], rows[1]], "fingerprint": w.fingerprint()}
    for key, value in (("max_tokens", max_tokens), ("groups", groups), ("unique_prefixes", unique_prefixes or None)):
        if value is not None:
            ref[key] = value
    return ref


def load_spec(load: Load) -> dict[str, Any]:
    """A load as JSON: ``{"kind": "concurrency", "users": 64}``, ``{"kind": "poisson",
    "rate": 12.0, "burstiness": 0.5, "seed": 1}`` or ``{"kind": "trace", "multiplier": 4}``."""
    match load:
        case Concurrency(users=u):
            return {"kind": "concurrency", "users": int(u)}
        case Poisson(rate=r, burstiness=b, seed=s):
            return {"kind": "poisson", "rate": float(r), "burstiness": float(b), "seed": int(s)}
        case TraceReplay(multiplier=m):
            return {"kind": "trace", "multiplier": float(m)}
    raise InputError(f"unknown load {load!r}")


def load_from(spec: dict[str, Any]) -> Load:
    kind = spec.get("kind")
    if kind == "concurrency":
        return Concurrency(int(spec["users"]))
    if kind == "poisson":
        return Poisson(rate=float(spec["rate"]), burstiness=float(spec.get("burstiness", 1.0)),
                       seed=int(spec.get("seed", 0)))
    if kind == "trace":
        return TraceReplay(float(spec["multiplier"]))
    raise InputError(f"unknown load kind {kind!r}")


def label(ref: dict[str, Any], load: dict[str, Any]) -> str:
    """Short text: ``prefill x64 @ 16 users``, ``azure 0-400 @ trace x6``."""
    what = (f"{ref['trace'].split('_')[0]} {ref['rows'][0]}-{ref['rows'][1]}"
            + (" shared prefixes" if ref.get("groups") else "") + (" made unique" if ref.get("unique_prefixes") else "")
            if ref.get("kind") == "trace" else f"{ref['kind']} x{ref['n']}")
    how = {"concurrency": lambda s: f"{s['users']} users",
           "poisson": lambda s: f"{s['rate']:g}/s" + ("" if s.get("burstiness", 1) == 1 else f" gamma {s['burstiness']:g}"),  # noqa: E501
           "trace": lambda s: f"trace x{s['multiplier']:g}"}[load["kind"]](load)
    return f"{what} @ {how}"


__all__ = ["CACHE_ENV", "SHAPES", "TRACES", "build", "cache_workload", "label", "load_from", "load_spec", "ref_of", "synthetic", "trace_ref",  # noqa: E501
           "trace_rows"]

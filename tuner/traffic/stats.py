"""Summary statistics of a workload, as ``tuner trace stats`` prints them."""
from __future__ import annotations

from typing import Any

import numpy as np

from tuner.traffic.workload import Workload


def _dist(x: np.ndarray) -> dict[str, float]:
    if not len(x):
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0}
    p50, p95 = np.percentile(x, [50, 95])
    return {"mean": float(x.mean()), "p50": float(p50), "p95": float(p95), "max": float(x.max())}


def dispersion(arrival_s: np.ndarray, bin_s: float = 1.0) -> float | None:
    """Index of dispersion (variance / mean) of arrival counts in ``bin_s`` windows from
    the first arrival: 1 for Poisson arrivals, above 1 for bursty ones. None when all
    requests arrive in one window (no time structure to measure)."""
    if len(arrival_s) < 2:
        return None
    bins = np.floor((arrival_s - arrival_s[0]) / bin_s).astype(np.int64)
    if bins[-1] == 0:
        return None
    counts = np.bincount(bins)
    return float(counts.var() / counts.mean())


def prefix_reuse(workload: Workload) -> float | None:
    """Ideal prefix-cache hit ratio: the fraction of all prompt blocks (hash ids, in
    arrival order) whose id appeared in an earlier request or earlier in the same one,
    i.e. what an infinite cache would hit. None without prefix structure."""
    if workload.hash_ids is None:
        return None
    sizes = [len(ids) for ids in workload.hash_ids]
    total = sum(sizes)
    if total == 0:
        return 0.0
    flat = np.fromiter((h for ids in workload.hash_ids for h in ids), dtype=np.int64, count=total)
    return float((total - len(np.unique(flat))) / total)


def trace_stats(workload: Workload) -> dict[str, Any]:
    """Count, span, mean rate, burstiness, length percentiles, prefix reuse, sessions."""
    n = len(workload)
    span = workload.span_s
    sessions = None
    if workload.session is not None:
        sessions = len({s for s in workload.session if s is not None})
    return {
        "source": workload.source,
        "fingerprint": workload.fingerprint(),
        "count": n,
        "span_s": span,
        "mean_rate_rps": n / span if span > 0 else None,
        "burstiness": dispersion(workload.arrival_s),
        "input_tokens": _dist(workload.prompt_tokens),
        "output_tokens": _dist(workload.output_tokens),
        "prefix_reuse": prefix_reuse(workload),
        "block_tokens": workload.block_tokens if workload.hash_ids is not None else None,
        "sessions": sessions,
        "estimated_tokens": workload.estimated_tokens,
        "notes": list(workload.notes),
    }

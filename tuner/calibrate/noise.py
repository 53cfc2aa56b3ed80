"""Run-to-run noise of the measured metrics: the defaults (:data:`DEFAULT_NOISE`), the
points measured twice (:func:`replicate_pairs`) and the noise they show
(:func:`measurement_noise`)."""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tuner.calibrate.points import METRICS, LoadPoint, load_points, point_name

#: Run-to-run noise of each metric (sd of its log) when no replicate runs say otherwise:
#: the H200 replicate (``h200-vllm-0.26.0/replicate.jsonl``) gave 0.08-0.10.
DEFAULT_NOISE = {"output_tokens_per_s": 0.08, "ttft_p95_s": 0.08, "tpot_mean_s": 0.08}
#: Smallest noise a metric is credited with (two runs that happen to agree prove little).
MIN_NOISE = 0.02


def replicate_pairs(rows: Iterable[dict[str, Any]], exclude: Iterable[str] = ()) -> list[tuple[LoadPoint, LoadPoint]]:
    """Load points measured twice on separate starts of the same configuration (a trial
    started again under another name, e.g. ``q7-base`` and ``q7-base-again``). A point named
    in ``exclude`` (``excluded_points.txt``) pairs with nothing: campaign 2's MoE probes that
    JIT-compiled the fused-MoE kernel differ from their warm campaign-4 twins by the compile,
    not by the start."""
    skip = set(exclude)
    by: dict[tuple[Any, ...], list[LoadPoint]] = {}
    for p in load_points(list(rows)):
        if point_name(p) not in skip:
            by.setdefault(p.what, []).append(p)
    return [(ps[0], q) for ps in by.values() if len({x.trial for x in ps}) > 1 for q in ps[1:]
            if q.trial != ps[0].trial]


def measurement_noise(first: Iterable[dict[str, Any]], again: Iterable[dict[str, Any]] = (),
                      *, pairs: Sequence[tuple[LoadPoint, LoadPoint]] = ()) -> dict[str, float]:
    """Run-to-run noise per metric (sd of the log of one run) from load points measured
    twice: ``first`` and ``again`` are measurement rows (pairs match by trial and load),
    ``pairs`` more pairs (:func:`replicate_pairs`). The log ratio of two runs has twice
    one run's variance."""
    seen = {p.key: p for p in load_points(list(first))}
    out = dict(DEFAULT_NOISE)
    pairs = [(seen[p.key], p) for p in load_points(list(again)) if p.key in seen] + list(pairs)
    if len(pairs) >= 3:
        for k in METRICS:
            d = np.array([math.log(b.measured[k] / a.measured[k]) for a, b in pairs])
            out[k] = max(MIN_NOISE, float(np.sqrt(np.mean(d**2) / 2)))
    return out


"""Measured against simulated: the simulator's run and the memory planner's answer for a
measured point (:func:`simulate_point`, :func:`predict_load`, :func:`predict_startup`), the
per-point tables (:func:`compare_loads`, :func:`compare_startups`) and their errors
(:func:`mape`, :func:`summarize`)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tuner.calibrate.points import METRICS, REPORTED, LoadPoint, Startup, point_name
from tuner.calibrate.probes import build, load_from
from tuner.calibrate.trials import calibration_workload
from tuner.core.errors import ConfigRejected
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency
from tuner.sim.engine import simulate
from tuner.sim.memory import plan_memory


def simulate_point(point: LoadPoint, deployment: Deployment, calib: Any = None) -> Any:
    """The simulator's run (a :class:`~tuner.serving.result.RunResult`) of the same workload rows and
    load as ``point``, on the point's own model shape when it names one."""

    if point.load is None:
        work, load = calibration_workload(point.requests, offset=point.offset), Concurrency(point.users)
    else:
        work, load = _built(point.workload), load_from(point.load)
    return simulate(_dep_model(deployment, point.model), point.config, work, load, profile=calib)


def predict_load(point: LoadPoint, deployment: Deployment, calib: Any = None) -> dict[str, float]:
    """The simulator's summary for the same workload rows and load as ``point``."""
    return simulate_point(point, deployment, calib).summary()


def _dep_model(deployment: Deployment, model: str | None) -> Deployment:
    import dataclasses

    return deployment if not model or model == deployment.model else dataclasses.replace(deployment, model=model)


_BUILT: dict[str, Any] = {}


def _built(ref: dict[str, Any] | None) -> Any:
    """:func:`tuner.calibrate.probes.build`, once per reference (a fit simulates each point often)."""
    import json

    key = json.dumps(ref, sort_keys=True)
    if key not in _BUILT:
        _BUILT[key] = build(ref or {})
    return _BUILT[key]


def predict_startup(config: ServeConfig, deployment: Deployment) -> dict[str, Any]:
    """The memory planner's answer: ``kv_cache_tokens`` or the refusal's kind and
    ``estimated_max_model_len``."""

    try:
        plan = plan_memory(deployment, config)
    except ConfigRejected as err:
        return {"ok": False, "kind": err.kind, "estimated_max_model_len": err.estimated_max_model_len,
                "message": err.message}
    return {"ok": True, "kv_cache_tokens": plan.kv_cache_tokens, "available_kv_gib": plan.kv_bytes / 2**30,
            "num_gpu_blocks": plan.num_gpu_blocks}


def mape(pred: Sequence[float], meas: Sequence[float]) -> float:
    """Mean absolute percentage error, in percent."""
    p, m = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    return float(np.mean(np.abs(p - m) / np.abs(m)) * 100.0)


def compare_loads(points: Sequence[LoadPoint], deployment: Deployment, calib: Any = None) -> list[dict[str, Any]]:
    """Per point: measured and predicted value of each metric."""
    out = []
    for pt in points:
        pred = predict_load(pt, deployment, calib)
        out.append({"trial": pt.trial, "name": point_name(pt), "model": pt.model or deployment.model,
                    "users": pt.users, "requests": pt.requests,
                    "workload": (pt.workload or {}).get("kind", "uniform"), "load": (pt.load or {}).get("kind",
                                                                                                    "concurrency"),
                    **{f"{k}_measured": pt.measured[k] for k in REPORTED if k in pt.measured},
                    **{f"{k}_predicted": float(pred[k]) for k in REPORTED if k in pt.measured}})
    return out


def summarize(table: Sequence[dict[str, Any]]) -> dict[str, float]:
    """MAPE per metric and the Spearman rank correlation of saturation throughput across
    configurations (each trial's highest load) over a :func:`compare_loads` table."""
    from scipy.stats import spearmanr

    out: dict[str, float] = {}
    for k in METRICS:
        out[f"{k}_mape"] = mape([r[f"{k}_predicted"] for r in table], [r[f"{k}_measured"] for r in table])
    top: dict[str, dict[str, Any]] = {}
    for r in table:
        if r["trial"] not in top or r["users"] > top[r["trial"]]["users"]:
            top[r["trial"]] = r
    thr = "output_tokens_per_s"
    if len(top) >= 3:
        rho = spearmanr([r[f"{thr}_measured"] for r in top.values()], [r[f"{thr}_predicted"] for r in top.values()])
        out["throughput_spearman_saturation"] = float(rho.statistic)
    if len(table) >= 3:
        rho = spearmanr([r[f"{thr}_measured"] for r in table], [r[f"{thr}_predicted"] for r in table])
        out["throughput_spearman_all"] = float(rho.statistic)
    return out


def compare_startups(points: Sequence[Startup], deployment: Deployment) -> list[dict[str, Any]]:
    """Per start: measured and predicted KV cache tokens (or the refusal), each on its model."""
    out = []
    for s in points:
        dep = _dep_model(deployment, s.model)
        pred = predict_startup(s.config, dep)
        row: dict[str, Any] = {"trial": s.trial, "model": s.model or deployment.model, "measured_ok": s.ok,
                               "predicted_ok": pred["ok"]}
        if s.ok and pred["ok"] and s.num_gpu_blocks:
            # the pool in blocks: for full attention the logged "GPU KV cache size" is the
            # same figure in tokens, but a start whose layers had a sliding window logs the
            # tokens its concurrency implies (the window caps a request's blocks), not the pool
            row.update(measured=s.kv_cache_tokens, predicted=pred["kv_cache_tokens"],
                       measured_blocks=s.num_gpu_blocks, predicted_blocks=pred["num_gpu_blocks"],
                       error_pct=100.0 * (pred["num_gpu_blocks"] - s.num_gpu_blocks) / s.num_gpu_blocks)
        elif s.ok and pred["ok"]:
            row.update(measured=s.kv_cache_tokens, predicted=pred["kv_cache_tokens"],
                       error_pct=100.0 * (pred["kv_cache_tokens"] - s.kv_cache_tokens) / s.kv_cache_tokens)
        elif not s.ok and not pred["ok"]:
            m, p = s.estimated_max_model_len, pred.get("estimated_max_model_len")
            row.update(measured=m, predicted=p, kind=s.rejected_kind, predicted_kind=pred["kind"],
                       error_pct=100.0 * (p - m) / m if m and p is not None else math.nan)
        else:
            row.update(measured=s.kv_cache_tokens or s.estimated_max_model_len,
                       predicted=pred.get("kv_cache_tokens") or pred.get("estimated_max_model_len"),
                       error_pct=math.nan)
        out.append(row)
    return out


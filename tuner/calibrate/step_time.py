"""The step-time fit: the simulator's step-time constants the fit moves
(:data:`STEP_PARAMS`, :func:`step_params`) and their MAP fit to measured load points
(:func:`fit_step_time`)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tuner.calibrate.comparison import predict_load
from tuner.calibrate.estimation import Param, fit_map, prior_starts
from tuner.calibrate.noise import DEFAULT_NOISE
from tuner.calibrate.points import METRICS, LoadPoint
from tuner.serving.config import Deployment

#: Step-time constants the fit moves: (name, scale of x, lower, upper, prior sd in units of
#: x). The prior's centre is the GPU class table's value (``tuner/data/calibration/<class>.yaml``,
#: whose sources say where each comes from); its sd says how far we would believe the data
#: moves it: HBM efficiency of decode GEMVs 0.7-0.9 of peak, GEMM efficiency 0.45-0.75, a
#: step overhead of a fraction of a millisecond to about 1.5 ms, a few microseconds per
#: request, eager launches within a factor of two of the class table, API latency up to
#: tens of milliseconds.
STEP_PARAMS = (
    ("hbm_efficiency", 1.0, 0.3, 1.0, 0.10),
    ("flops_efficiency", 1.0, 0.15, 1.0, 0.15),
    ("step_overhead_s", 1e-3, 0.0, 5.0, 0.5),
    ("per_seq_overhead_s", 1e-6, 0.0, 60.0, 4.0),
    ("launch_eager", 1e-6, 0.0, 2000.0, 300.0),
    ("launch_piecewise", 1e-6, 0.0, 500.0, 60.0),
    ("request_latency_s", 1e-3, 0.0, 50.0, 20.0),
    ("frontend_per_token_s", 1e-6, 0.0, 500.0, 40.0),
    ("frontend_per_request_s", 1e-3, 0.0, 20.0, 2.0),
    ("moe_flops_efficiency", 1.0, 0.05, 1.0, 0.3),
)


#: Relative finite-difference step of the Jacobian: the simulator is a discrete-event
#: model, so its outputs move in small jumps; 3 % steps see the trend, not the jumps.
DIFF_STEP = 0.03


def _with_params(base: Any, x: np.ndarray) -> Any:
    vals = {name: float(v * scale) for (name, scale, *_), v in zip(STEP_PARAMS, x)}
    launch = dict(base.launch_per_layer_s)
    ratio = launch["compiled"] / launch["piecewise"] if launch.get("piecewise") else 2.0
    launch["eager"] = vals.pop("launch_eager")
    launch["piecewise"] = vals.pop("launch_piecewise")
    launch["compiled"] = launch["piecewise"] * ratio
    return base.replace(launch_per_layer_s=launch, **vals)


def _params_of(calib: Any) -> np.ndarray:
    vals = {"hbm_efficiency": calib.hbm_efficiency, "flops_efficiency": calib.flops_efficiency,
            "step_overhead_s": calib.step_overhead_s, "per_seq_overhead_s": calib.per_seq_overhead_s,
            "launch_eager": calib.launch_per_layer_s["eager"],
            "launch_piecewise": calib.launch_per_layer_s["piecewise"],
            "request_latency_s": getattr(calib, "request_latency_s", 0.0),
            "frontend_per_token_s": getattr(calib, "frontend_per_token_s", 0.0),
            "frontend_per_request_s": getattr(calib, "frontend_per_request_s", 0.0),
            "moe_flops_efficiency": getattr(calib, "moe_flops_efficiency", 1.0)}
    return np.array([min(max(vals[n] / s, lo), hi) for n, s, lo, hi, _ in STEP_PARAMS])


def step_params(prior: Any) -> list[Param]:
    """The fitted constants as :class:`tuner.calibrate.estimation.Param`, their priors centred on
    ``prior`` (a :class:`~tuner.sim.calibration.Calibration`, normally the class table)."""
    return [Param(name, scale, lo, hi, float(x), sd)
            for (name, scale, lo, hi, sd), x in zip(STEP_PARAMS, _params_of(prior))]


def fit_step_time(points: Sequence[LoadPoint], deployment: Deployment, base: Any, *,
                  noise: dict[str, float] | None = None, starts: int = 1, seed: int = 0,
                  max_nfev: int | None = None, log: Callable[[str], None] | None = None,
                  start: Any | None = None) -> tuple[Any, dict[str, Any]]:
    """MAP fit (:func:`tuner.calibrate.estimation.fit_map`) of the step-time constants to the
    measured load points, run to convergence: residuals are the log ratios
    predicted/measured of :data:`METRICS`, each over its run-to-run ``noise``; priors are
    centred on ``base``. ``starts`` > 1 also starts from draws of the priors (the info
    says whether they found the same optimum); ``start`` (a calibration, e.g. a shipped
    profile's) replaces those starts by one at its constants, the priors unchanged: a fit
    that moves away from it says the constants are not this data's optimum. Returns the fitted calibration and an
    info dict whose ``estimates`` give each constant's value, sd, 95 % interval and
    whether the data determined it."""
    sigma = {**DEFAULT_NOISE, **(noise or {})}
    calls = [0]

    def resid(x: np.ndarray) -> np.ndarray:
        calib = _with_params(base, x)
        out = []
        for pt in points:
            pred = predict_load(pt, deployment, calib)
            for k in METRICS:
                out.append(math.log(max(pred[k], 1e-9) / pt.measured[k]) / sigma[k])
        calls[0] += 1
        if log and calls[0] % 25 == 0:
            log(f"calibrate: fit evaluation {calls[0]}, chi-square {float(np.sum(np.square(out))):.2f}")
        return np.array(out)

    params = step_params(base)
    first = prior_starts(params, starts, seed) if start is None else [_params_of(start)]
    outcome = fit_map(resid, params, starts=first, diff_step=DIFF_STEP, max_nfev=max_nfev)
    info = {**outcome.info, "evaluations": calls[0], "noise": sigma,
            "estimates": {e.name: e.to_dict() for e in outcome.estimates}}
    return _with_params(base, outcome.x), info


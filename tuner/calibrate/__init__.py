"""Calibrate the simulator against a real vLLM on a real GPU.

Three steps, each a plain function that notebooks and ``tuner calibrate`` call alike:

1. :func:`design_trials` — a small designed set of server configurations spanning
   ``gpu_memory_utilization``, ``max_num_seqs``, ``max_num_batched_tokens`` and eager vs
   CUDA graphs, with three closed-loop loads each (1 user for the decode floor, a middle
   load, saturation), plus one configuration vLLM must refuse for ``max_model_len``.
2. :func:`measure` — starts each configuration through a backend (the tuner's own
   :class:`~tuner.backends.vllm.VllmBackend`; ``tuner sim-serve`` behind it for a dry run),
   records vLLM's startup lines (KV cache size, model loading, graph memory) or its refusal,
   replays each load with the tuner's replayer and appends one JSON line per observation
   to ``measurements.jsonl``. Resumable: trials already in the file are skipped, so one
   command can be re-run until every trial is done (a GPU lease in slices).
3. :func:`fit` — least squares (``scipy.optimize.least_squares``) of the simulator's
   step-time constants (:class:`tuner.sim.calibration.Calibration`) and the memory
   planner's empirical constants (:data:`tuner.sim.memory.EMPIRICAL`) to the measurements;
   :func:`write_profile` writes the profile YAML (the calibration's own format, plus a
   ``memory`` section, ``match`` keys and the fit's error per metric) beside the raw data.

Everything here needs no GPU except :func:`measure` with a real vLLM.

The package, one module per noun: ``trials`` (the design), ``measurements`` (the files),
``campaign`` (:func:`measure`), ``points`` (the measured loads and starts), ``comparison``
(simulated against measured), ``memory_fit``, ``noise``, ``step_time`` and ``profile``
(:func:`fit`, :func:`write_profile`). Every public name is imported here. Beside them, imported by
their own path: ``probes`` (named, reproducible workloads and loads), ``estimation`` (fitting
constants with priors), ``fidelity`` (the simulator's error against real vLLM) and ``gate`` (the
fidelity gate per shape group).
"""
from __future__ import annotations

from tuner.calibrate.campaign import install_sigterm_handler, measure
from tuner.calibrate.comparison import (
    compare_loads,
    compare_startups,
    mape,
    predict_load,
    predict_startup,
    simulate_point,
    summarize,
)
from tuner.calibrate.measurements import MEASUREMENTS, campaign_rows, read_measurements, read_names
from tuner.calibrate.memory_fit import GiB, fit_memory
from tuner.calibrate.noise import DEFAULT_NOISE, MIN_NOISE, measurement_noise, replicate_pairs
from tuner.calibrate.points import METRICS, REPORTED, LoadPoint, Startup, load_points, load_rows, point_name, startups
from tuner.calibrate.profile import FitResult, fit, write_profile
from tuner.calibrate.step_time import DIFF_STEP, STEP_PARAMS, fit_step_time, step_params
from tuner.calibrate.trials import (
    OUTPUT_RANGE,
    PROMPT_RANGE,
    WORKLOAD_SEED,
    Probe,
    Trial,
    calibration_workload,
    design_trials,
    requests_for,
)

__all__ = [
    "MEASUREMENTS",
    "PROMPT_RANGE",
    "OUTPUT_RANGE",
    "WORKLOAD_SEED",
    "Probe",
    "Trial",
    "calibration_workload",
    "requests_for",
    "design_trials",
    "read_measurements",
    "measure",
    "install_sigterm_handler",
    "METRICS",
    "REPORTED",
    "LoadPoint",
    "Startup",
    "startups",
    "load_points",
    "load_rows",
    "simulate_point",
    "predict_load",
    "predict_startup",
    "mape",
    "compare_loads",
    "summarize",
    "GiB",
    "fit_memory",
    "STEP_PARAMS",
    "DEFAULT_NOISE",
    "MIN_NOISE",
    "DIFF_STEP",
    "step_params",
    "replicate_pairs",
    "measurement_noise",
    "fit_step_time",
    "FitResult",
    "compare_startups",
    "point_name",
    "fit",
    "read_names",
    "campaign_rows",
    "write_profile",
]

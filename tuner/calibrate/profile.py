"""The fitted profile: :func:`fit` (memory then step time, checked on the points held
back) and its :class:`FitResult`, and :func:`write_profile`, the profile YAML the simulator
finds by GPU and vLLM version."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.calibrate.comparison import compare_loads, compare_startups, summarize
from tuner.calibrate.memory_fit import fit_memory
from tuner.calibrate.points import load_points, point_name, startups
from tuner.calibrate.step_time import fit_step_time
from tuner.core.files import write_atomic
from tuner.runtime.progress import Observer
from tuner.serving.config import Deployment
from tuner.sim.calibration import load_calibration
from tuner.sim.hardware import get_gpu


@dataclass(frozen=True)
class FitResult:
    """A fitted profile and how well it does on the points it was fitted to and on the
    points held back."""

    calibration: Any
    memory: dict[str, Any]
    fit_trials: tuple[str, ...]
    check_trials: tuple[str, ...]
    table: list[dict[str, Any]]            # compare_loads rows of every point, with "set"
    kv_table: list[dict[str, Any]]         # per start: measured vs predicted KV tokens / refusal
    errors: dict[str, dict[str, float]]    # "fit" / "check" -> summarize()
    info: dict[str, Any] = field(default_factory=dict)


def fit(rows: Sequence[dict[str, Any]], deployment: Deployment, *, fit_trials: Sequence[str] | None = None,
        fit_points: Sequence[str] | None = None, noise: dict[str, float] | None = None, starts: int = 1,
        max_nfev: int | None = None, graph_fraction: float | None = None, exclude: Sequence[str] = (),
        observer: Observer | None = None, start: Any | None = None) -> FitResult:
    """Fit memory and step-time constants on ``fit_trials`` (default: the first half of the
    trials with loads, in design order: the anchor, eager, a small batch cap, KV-limited)
    and check on the rest. ``fit_points`` instead names what the fit sees, point by point
    (:func:`point_name`, ``"q7-base: mix x5 @ 1 users"``) or whole trials; the memory fit
    sees the starts of the trials named. The memory fit runs first; the step-time fit sees
    its weights. The step-time fit runs to convergence (``max_nfev`` caps it) from
    ``starts`` starts (or from ``start``'s constants, :func:`fit_step_time`); ``noise`` is
    each metric's run-to-run noise (:func:`measurement_noise`).
    Points named in ``exclude`` are neither fitted nor checked (a replay a known artefact
    spoiled; the profile says why). ``observer`` sees the fit's progress (None: headless)."""
    import tempfile

    log = None if observer is None else observer.on_phase

    dropped = set(exclude)
    loads, started = [p for p in load_points(rows) if point_name(p) not in dropped], startups(rows)
    with_loads = list(dict.fromkeys(p.trial for p in loads))
    if fit_points is not None:
        chosen = set(fit_points)
        in_fit = lambda p: p.trial in chosen or point_name(p) in chosen  # noqa: E731
        fit_trials = tuple(dict.fromkeys([p.trial for p in loads if in_fit(p)]
                                         + [t for t in chosen if ":" not in t]))
    else:
        if fit_trials is None:
            fit_trials = with_loads[: max(1, len(with_loads) // 2)]
        in_fit = lambda p: p.trial in set(fit_trials)  # noqa: E731
    fit_set = set(fit_trials)
    check = tuple(t for t in dict.fromkeys([s.trial for s in started] + with_loads)
                  if t not in fit_set or any(p.trial == t and not in_fit(p) for p in loads))
    # the activation constants from the fitted trials' starts; each shape's load overhead from
    # its own "Model loading took" line, wherever a start of that shape logged one
    memory, mem_info = fit_memory([s for s in started if s.trial in fit_set], deployment,
                                  graph_fraction=graph_fraction, loads=started)
    base = load_calibration(get_gpu(deployment.gpu))
    with tempfile.TemporaryDirectory() as tmp:
        # the memory constants reach plan_memory through Deployment.calibration
        prof = Path(tmp) / "profile.yaml"
        _write_yaml(prof, base, memory, match={}, extra={})
        dep = _dep_with(deployment, str(prof))
        calib, step_info = fit_step_time([p for p in loads if in_fit(p)], dep, base, noise=noise,
                                         starts=starts, max_nfev=max_nfev, log=log, start=start)
        table, kv_table, errors = _report(loads, started, in_fit, fit_set, dep, calib)
    return FitResult(calibration=calib.replace(calibrated=True), memory=memory, fit_trials=tuple(fit_trials),
                     check_trials=check, table=table, kv_table=kv_table, errors=errors,
                     info={"memory": mem_info, "step_time": step_info,
                           **({"fit_points": list(fit_points)} if fit_points is not None else {}),
                           **({"excluded": list(exclude)} if exclude else {})})


def _report(loads: Sequence[Any], started: Sequence[Any], in_fit: Any, fit_set: set[str], dep: Deployment,
            calib: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Every load point and start compared with the simulator under ``calib``, each marked
    ``fit`` or ``check``, and the errors of each set (the profile's ``fit.errors``)."""
    table = []
    for pt, row in zip(loads, compare_loads(loads, dep, calib)):
        row["set"] = "fit" if in_fit(pt) else "check"
        table.append(row)
    kv_table = compare_startups(started, dep)
    for row in kv_table:
        row["set"] = "fit" if row["trial"] in fit_set else "check"
    errors = {name: summarize([r for r in table if r["set"] == name]) for name in ("fit", "check")
              if any(r["set"] == name for r in table)}
    kv_err = [abs(r["error_pct"]) for r in kv_table
              if r["measured_ok"] and not math.isnan(r.get("error_pct", math.nan))]
    refusal_err = [abs(r["error_pct"]) for r in kv_table
                   if not r["measured_ok"] and not math.isnan(r.get("error_pct", math.nan))]
    errors["kv"] = {"max_abs_error_pct": max(kv_err) if kv_err else math.nan,
                    "starts": float(len(kv_err)),
                    "refusals_matched": float(sum(1 for r in kv_table if not r["measured_ok"] and not r["predicted_ok"])),  # noqa: E501
                    "refusal_max_model_len_error_pct": max(refusal_err) if refusal_err else math.nan}
    return table, kv_table, errors


def rewrite_report(folder: str | Path, rows: Sequence[dict[str, Any]], deployment: Deployment, *, why: str) -> dict[str, Any]:  # noqa: E501
    """Recompute the ``fit.errors`` of the profile in ``folder`` for its constants as they
    stand and write them back, the constants untouched: after a constant was set from other
    measurements (``why`` says which, kept as ``fit.report``) rather than refitted with the
    rest. The same points are fit and check as in the fit the profile records. Returns the errors."""
    import yaml

    path = Path(folder) / "profile.yaml"
    doc = yaml.safe_load(path.read_text())
    record = doc.get("fit") or {}
    dropped = set(record.get("excluded") or [])
    chosen = set(record.get("fit_points") or record.get("fit_trials") or [])
    loads = [p for p in load_points(rows) if point_name(p) not in dropped]
    dep = _dep_with(deployment, str(path))
    calib = load_calibration(get_gpu(deployment.gpu), str(path))
    _, _, errors = _report(loads, startups(rows), lambda p: p.trial in chosen or point_name(p) in chosen,
                           set(record.get("fit_trials") or []), dep, calib)
    doc["fit"] = {**record, "errors": _errors_doc(errors), "report": why}
    write_atomic(path, yaml.safe_dump(doc, sort_keys=False, width=110))
    return errors


def _errors_doc(errors: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """``fit.errors`` as the profile YAML holds them: floats to 4 decimals, NaN as null."""
    return {name: {k: (None if isinstance(v, float) and math.isnan(v) else round(v, 4) if isinstance(v, float) else v)
                   for k, v in e.items()} for name, e in errors.items()}


def _dep_with(deployment: Deployment, calibration: str | None) -> Deployment:
    import dataclasses

    return dataclasses.replace(deployment, calibration=calibration)


def _round(v: float) -> float:
    return float(f"{v:.4g}")


def _write_yaml(path: Path, calib: Any, memory: dict[str, Any], *, match: dict[str, str],
                extra: dict[str, Any], sources: dict[str, str] | None = None,
                estimates: dict[str, dict[str, Any]] | None = None) -> None:
    import yaml

    src = sources or {}
    est = estimates or {}

    def interval(name: str) -> dict[str, Any]:
        e = est.get(name)
        if not e:
            return {}
        return {"ci95": [_round(e["ci95"][0]), _round(e["ci95"][1])], "determined": e["determined"]}

    doc: dict[str, Any] = {"gpu_class": calib.gpu_class, "calibrated": True}
    for name in ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "per_seq_overhead_s",
                 "request_latency_s", "frontend_per_token_s", "frontend_per_request_s", "moe_flops_efficiency",
                 "moe_layer_s", "moe_hbm_efficiency", "allreduce_latency_s", "link_efficiency"):
        if getattr(calib, name) is None:  # moe_hbm_efficiency unset: hbm_efficiency's
            continue
        doc[name] = {"value": _round(getattr(calib, name)), **interval(name),
                     "source": src.get(name, calib.sources.get(name, ""))}
    launch: dict[str, Any] = {"value": {k: _round(v) for k, v in calib.launch_per_layer_s.items()}}
    modes = {m: interval(f"launch_{m}") for m in calib.launch_per_layer_s if interval(f"launch_{m}")}
    if modes:
        launch["ci95"] = {m: v["ci95"] for m, v in modes.items()}
        launch["determined"] = {m: v["determined"] for m, v in modes.items()}
    launch["source"] = src.get("launch_per_layer_s", calib.sources.get("launch_per_layer_s", ""))
    doc["launch_per_layer_s"] = launch

    def plain(v: Any) -> Any:  # numbers (and the per-model mapping of them) as YAML writes them
        if isinstance(v, dict):
            return {str(m): plain(b) for m, b in v.items()}
        return float(v) if isinstance(v, float) else int(v)

    doc["memory"] = {k: plain(v) for k, v in memory.items()}
    if match:
        doc["match"] = match
    doc.update(extra)
    path.parent.mkdir(parents=True, exist_ok=True)

    write_atomic(path, yaml.safe_dump(doc, sort_keys=False, width=110))


def write_profile(result: FitResult, path: str | Path, *, gpu: str, vllm_version: str,
                  meta: dict[str, Any] | None = None) -> Path:
    """Write the fitted profile YAML (hopper.yaml's format: ``value`` + ``source`` per
    constant, plus ``memory``, ``match`` and ``fit``): what ``tuner estimate``, ``tuner
    search --backend sim`` and the pre-check load when GPU and vLLM version match. Each
    fitted constant also carries its 95 % interval and whether the data determined it
    (``determined: data``) or it stayed at the class table's prior (``prior``)."""
    p = Path(path)
    step = result.info.get("step_time") or {}
    fitted = ("fit: MAP least squares (class table as prior) on trials " + ", ".join(result.fit_trials)
              + " (tuner calibrate)")
    sources = {k: fitted for k in ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "per_seq_overhead_s",
                                   "request_latency_s", "frontend_per_token_s", "frontend_per_request_s",
                                   "moe_flops_efficiency", "launch_per_layer_s")}
    how = {}
    if step:
        how = {"method": "maximum a posteriori least squares, run to convergence (tuner.calibrate.estimation.fit_map)",
               "noise": {k: round(float(v), 4) for k, v in (step.get("noise") or {}).items()},
               "reduced_chi2": round(float(step.get("reduced_chi2", math.nan)), 3),
               "starts": int(step.get("starts", 1)),
               "start_spread_sd": round(float(step.get("start_spread_sd", 0.0)), 3),
               "start_costs": [round(float(c), 3) for c in step.get("start_costs", [])],
               "correlated": [f"{a} ~ {b}: {rho:+.2f}" for a, b, rho in step.get("correlated", [])],
               "evaluations": int(step.get("evaluations", 0))}
    chosen = {k: result.info[k] for k in ("fit_points", "excluded") if k in result.info}
    extra = {"fit": {"fit_trials": list(result.fit_trials), "check_trials": list(result.check_trials), **chosen, **how,
                     "errors": _errors_doc(result.errors),
                     **({"meta": meta} if meta else {})}}
    _write_yaml(p, result.calibration, result.memory, match={"gpu": gpu, "vllm_version": vllm_version},
                extra=extra, sources=sources, estimates=step.get("estimates"))
    return p


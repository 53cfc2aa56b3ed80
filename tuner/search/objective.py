"""One trial's objective: a configuration's goodput, or why it has none.

:func:`evaluate_config`: pre-check (the simulator's memory planner: a configuration vLLM
would refuse is infeasible with vLLM's reason and costs no launch), start, the goodput
search (:mod:`tuner.search.goodput`), and what the trial stores of it. The P95 TTFT
constraint goes to the sampler as an Optuna constraint named :data:`CONSTRAINT`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.core.errors import ConfigRejected, InputError
from tuner.core.jsonsafe import json_safe
from tuner.core.urls import redact, redact_value
from tuner.runtime.progress import Observer, observer_or_headless
from tuner.search.goodput import EDGE_TOLERANCE, MAX_REPLAYS, LoadPoint, edge_width, goodput_search, max_users
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.slo import OBJECTIVES as OBJECTIVE_UNITS
from tuner.serving.slo import SloSet
from tuner.study.record import Edge, LoadRecord, RunFacts, TrialRecord

if TYPE_CHECKING:
    from tuner.search.backend import Backend
    from tuner.traffic.workload import Workload

#: Name of the trial constraint: P95 TTFT / target - 1 (<= 0 feasible; 1.0 for refusals).
#: Every SLO of a set is a constraint of its own, named :func:`constraint_name`.
CONSTRAINT = "p95_ttft_over_target"

#: What a trial scores at its edge (:data:`tuner.serving.slo.OBJECTIVES`, with their units).
OBJECTIVES = tuple(OBJECTIVE_UNITS)


def constraint_name(slo_name: str) -> str:
    """``p99_tpot`` -> ``p99_tpot_over_target`` (``p95_ttft``: :data:`CONSTRAINT`)."""
    return f"{slo_name}_over_target"


def slo_constraints(slos: SloSet, ratios: dict[str, float] | None, floor: float | None = None) -> dict[str, float]:
    """One Optuna constraint per SLO: measured / bound - 1 (1.0 where nothing was
    measured, or for a refusal: ``ratios`` None); at least ``floor`` when given."""
    out = {}
    for s in slos.slos:
        r = (ratios or {}).get(s.name, math.inf)
        c = r - 1.0 if math.isfinite(r) else 1.0
        out[constraint_name(s.name)] = max(c, floor) if floor is not None else c
    return out


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What one configuration scored. ``value`` is tokens/s at the chosen load (0 when
    infeasible); ``constraint`` is P95 TTFT / target − 1 at that load (> 0 infeasible);
    ``record`` what the trial stores of it (its ``run`` holds only what the start
    reported: the study's facts are the driver's)."""

    feasible: bool
    value: float
    constraint: float
    record: TrialRecord = field(default_factory=TrialRecord)
    gpu_s: float = 0.0
    constraints: dict[str, float] = field(default_factory=dict)

    def named_constraints(self) -> dict[str, float]:
        """What the trial gives Optuna: one constraint per SLO (just :data:`CONSTRAINT`
        for a P95 TTFT target alone)."""
        return self.constraints or {CONSTRAINT: self.constraint}


def evaluate_config(
    backend: Backend,
    deployment: Deployment,
    config: ServeConfig,
    workload: Workload,
    target_ttft_s: float | SloSet,
    *,
    load_kind: str = "concurrency",
    max_replays: int = MAX_REPLAYS,
    precheck: bool = True,
    early_stop: bool = True,
    seed: int = 0,
    observer: Observer | None = None,
    incumbent: float | None = None,
    start_level: float | None = None,
    expected_value: float | None = None,
    edge_tolerance: float = EDGE_TOLERANCE,
    objective: str = "tokens",
    itl_tail_s: float | None = None,
    start_refused: bool = False,
) -> Evaluation:
    """Score one configuration (see the module docstring). Raises only for backend
    crashes (:class:`~tuner.core.errors.BackendError` and the like); refusals are results.

    ``incumbent`` is the best value the study has so far: once a passing load is found,
    refining stops when even the failing load above it could not beat the incumbent.
    ``start_level`` (a predicted load, :mod:`tuner.search.prediction`) is the first load tried
    instead of the most the configuration holds; ``expected_value`` (the predicted
    tokens/s) stops refining a passing load of a configuration not expected to come
    within reach of the incumbent. ``itl_tail_s`` (the study's inter-token tail) tells a
    replay whose every stream stalled at once (:class:`~tuner.core.errors.Disrupted`, raised).
    ``start_refused``: a configuration the memory planner
    predicts vLLM will refuse for memory is started anyway, and the start's outcome is
    recorded beside the prediction (:mod:`tuner.search.refusal`)."""
    obs = observer_or_headless(observer)
    slos = SloSet.of(target_ttft_s)
    target = slos.target_ttft_s
    rec = TrialRecord(config=config, target_ttft_s=target, slos=() if slos.only_ttft else slos.texts)
    facts: dict[str, Any] = {}
    launched = 0.0
    try:
        if precheck:
            obs.on_phase("pre-check")
            facts = {**planner_precheck(deployment, config, start_refused=start_refused),
                     **(backend.precheck(deployment, config) or {})}
            rec = rec.replace(run=RunFacts(plan=json_safe(facts)))
        obs.on_phase("starting")
        launched = time.perf_counter()
        instance = backend.start(deployment, config)
    except ConfigRejected as err:
        # a real refused start cost its wall time on the GPUs; the simulator's costs nothing
        spent = time.perf_counter() - launched if launched and backend.measures_gpu_time else 0.0
        return rejected(judged(rec, err, obs), err, launched=bool(launched), gpu_s=spent, slos=slos)
    info = dict(getattr(instance, "info", {}) or {})
    rec = judged(rec, info, obs)
    startup_s = float(info.get("startup_s") or 0.0)
    rec = rec.replace(run=rec.run.replace(
        startup_s=startup_s, log_paths=tuple(json_safe(info.get("log_paths") or [])),
        vllm_version=info.get("vllm_version") or deployment.vllm_version))
    points: list[LoadPoint] = []
    try:
        with instance:
            points = goodput_search(
                instance, workload, slos, load_kind=load_kind, max_replays=max_replays,
                early_stop=early_stop, seed=seed, observer=obs,
                top=max_users(facts, info, config, workload), incumbent=incumbent,
                start=start_level, expected=expected_value, tolerance=edge_tolerance,
                ceiling=max(1, len(workload) // 2), itl_tail_s=itl_tail_s,
            )
    except ConfigRejected as err:  # e.g. a request the max-model-len cannot hold
        return rejected(rec, err, launched=True, gpu_s=startup_s, slos=slos)
    replay_s = sum(p.result.duration_s for p in points)
    gpu_s = startup_s + replay_s
    passed = [p for p in points if p.passed]
    lowest = min(points, key=lambda p: p.level)
    rec = rec.replace(
        gpu_s=gpu_s, loads=tuple(LoadRecord.from_dict(json_safe({
            "load": p.load.label, "level": p.level, "p95_ttft_s": p.summary.get("ttft_p95_s"),
            "tokens_per_s": p.summary.get("tokens_per_s"), "error_rate": p.summary.get("error_rate"),
            "errors": p.errors, "duration_s": p.result.duration_s, "stopped_early": p.result.stopped_early,
            "passed": p.passed})) for p in points),
        p95_ttft_at_lowest_load_s=json_safe(lowest.summary.get("ttft_p95_s")), lowest_load=lowest.load.label,
    )
    if not passed:
        over = lowest.severity if math.isfinite(lowest.severity) else 2.0
        constraint = over - 1.0
        floor = None
        if lowest.failed_by_errors:
            # errors failed the load, whatever its latencies (those of the few requests served)
            reason = lowest.error_reason()
            if not slos.meets({**lowest.summary, "error_rate": 0.0}) and math.isfinite(lowest.severity):
                reason += f"; {over_text(slos, lowest)} too"
            constraint = max(constraint, 1.0)
            floor = 1.0
        elif math.isfinite(lowest.severity):
            reason = (f"{over_text(slos, lowest)} even at {lowest.load.label}"
                      + (" (replay stopped early: >5% of requests already over)" if lowest.result.stopped_early
                         else ""))
        else:
            reason = f"no request completed at {lowest.load.label}"
        constraints = slo_constraints(slos, slos.ratios(lowest.summary), floor)
        rec = rec.replace(
            feasible=False, constraint=constraint, infeasible_reason=reason,
            failed_by="errors" if lowest.failed_by_errors else "latency",
            summary=json_safe(lowest.summary), server=json_safe(redact_value(lowest.result.server)),
            tokens_per_s=0.0, output_tokens_per_s=0.0, **error_fields(lowest),
            **slo_fields(slos, lowest, constraints),
        )
        return Evaluation(False, 0.0, constraint, rec, gpu_s, {} if slos.only_ttft else constraints)
    best = max(passed, key=lambda p: p.level)
    above = [p for p in points if not p.passed and p.level > best.level and p.level != math.inf]
    failing = min(above, key=lambda p: p.level) if above else None
    cap = max_users(facts, info, config, workload)
    s = best.summary
    constraints = slo_constraints(slos, slos.ratios(s))
    rec = rec.replace(
        edge=Edge(**json_safe({
            "level": best.level, "failing_level": failing.level if failing else None,
            "located": failing is not None and failing.level - best.level <= edge_width(best.level, load_kind,
                                                                                         edge_tolerance),
            "tolerance": edge_tolerance, "cap": cap if load_kind == "concurrency" else None,
            "beyond_cap": load_kind == "concurrency" and best.level > cap})),
        feasible=True, constraint=best.severity - 1.0, **slo_fields(slos, best, constraints),
        summary=json_safe(s), server=json_safe(redact_value(best.result.server)),
        tokens_per_s=float(s["tokens_per_s"]), output_tokens_per_s=float(s["output_tokens_per_s"]),
        error_rate=float(s["error_rate"]), chosen_load=best.load.label, **error_fields(best),
    )
    value = float(s["tokens_per_s"]) if objective == "tokens" else float(s["goodput_requests_per_s"])
    return Evaluation(True, value, rec.constraint, rec, gpu_s,
                      {} if slos.only_ttft else constraints)


def over_text(slos: SloSet, point: LoadPoint) -> str:
    """``P95 TTFT 2.4 s over the 2 s target`` (for a P95 TTFT target alone, as before
    SLO sets), else ``P99 TPOT 41 ms over its 30 ms bound (p99:tpot<=30ms binds)``."""
    slo = slos.binding(point.summary)
    value = slo.measured(point.summary)
    if slos.only_ttft:
        return f"P95 TTFT {value:.3g} s over the {slo.bound_s:g} s target"
    shown = f"{value * 1e3:.3g} ms" if slo.bound_s < 1 else f"{value:.3g} s"
    return f"{slo.label()} {shown} over its {slo.bound_text(' ')} bound ({slo.text} binds)"


def slo_fields(slos: SloSet, point: LoadPoint, constraints: dict[str, float]) -> dict[str, Any]:
    """The record's goodput at the point, the SLO that binds there and (for a set beyond
    P95 TTFT) one constraint per SLO."""
    out: dict[str, Any] = {"binding_slo": point.binding or None,
                           "goodput_requests_per_s": json_safe(point.summary.get("goodput_requests_per_s"))}
    if not slos.only_ttft:
        out["constraints"] = json_safe(constraints)
    return out


def error_fields(point: LoadPoint) -> dict[str, Any]:
    """``errors`` (kind -> count) of a load point, and ``error_detail`` when any failed."""
    errors = point.errors
    out: dict[str, Any] = {"errors": errors}
    if errors:
        out["error_detail"] = {k: redact(v)[:300] for k, v in point.result.error_detail.items() if k in errors}
    return out


def planner_precheck(deployment: Deployment, config: ServeConfig, *, start_refused: bool = False) -> dict[str, Any]:
    """The simulator's memory plan, as a pre-check before a real backend starts anything:
    raises ConfigRejected where vLLM would refuse. A deployment the simulator cannot
    model (a GPU or model it does not know) is not pre-checked: ``{}``. ``start_refused``:
    a refusal for memory is not raised but returned as the plan's ``predicted_refusal``
    (:func:`tuner.search.refusal.prediction`: its margin and the planner's error), so the
    configuration is started and the start judges the prediction."""
    from tuner.backends.sim import SimBackend
    from tuner.search.refusal import MEMORY_REFUSALS, prediction

    try:
        return SimBackend().precheck(deployment, config)
    except InputError:
        return {}
    except ConfigRejected as err:
        if not start_refused or err.kind not in MEMORY_REFUSALS:
            raise
        return {"predicted_refusal": prediction(deployment, config, err)}


def judged(rec: TrialRecord, outcome: ConfigRejected | dict[str, Any], obs: Any) -> TrialRecord:
    """``rec`` with the start's outcome beside a predicted refusal it was started against
    (:func:`tuner.search.refusal.judge`), and a warning where the start proved the prediction wrong."""
    from tuner.search.refusal import judge

    predicted = (rec.run.plan or {}).get("predicted_refusal")
    if not predicted:
        return rec
    verdict = judge(predicted, outcome)
    if not verdict["confirmed"]:
        obs.on_warning(verdict["judged"])
    return rec.replace(run=rec.run.replace(plan={**rec.run.plan, "predicted_refusal": {**predicted, **verdict}}))


def rejected(rec: TrialRecord, err: ConfigRejected, *, launched: bool, gpu_s: float = 0.0,
             slos: SloSet | None = None) -> Evaluation:
    reason = f"{err.kind}: {redact(err.message)}"
    if launched and (predicted := (rec.run.plan or {}).get("predicted_refusal")):  # started as --start-refused asked
        reason += f"; started although the memory planner predicted this refusal: {predicted['text']}"
    rec = rec.replace(
        feasible=False, constraint=1.0, tokens_per_s=0.0, output_tokens_per_s=0.0,
        infeasible_reason=reason, rejected_kind=err.kind,
        rejected_at="start" if launched else "pre-check", gpu_s=gpu_s,
    )
    if err.log_path:
        rec = rec.replace(run=rec.run.replace(log_paths=(err.log_path,)))
    constraints = {} if slos is None or slos.only_ttft else slo_constraints(slos, None)
    if constraints:
        rec = rec.replace(constraints=constraints)
    return Evaluation(False, 0.0, 1.0, rec, gpu_s, constraints)

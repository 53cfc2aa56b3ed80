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

from tuner.backends.sim import SimBackend
from tuner.core.errors import ConfigRejected, InputError
from tuner.core.jsonsafe import json_safe
from tuner.core.urls import redact, redact_value
from tuner.search.constraints import CONSTRAINT
from tuner.search.context import TrialContext
from tuner.search.goodput import LoadPoint, edge_width, goodput_search, max_users
from tuner.search.refusal import MEMORY_REFUSALS, judge, prediction
from tuner.search.settings import SearchSettings
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.slo import OBJECTIVES as OBJECTIVE_UNITS
from tuner.serving.slo import SloSet
from tuner.study.record import Edge, LoadRecord, RunFacts, TrialRecord

if TYPE_CHECKING:
    from tuner.runtime.progress import Observer
    from tuner.search.backend import Backend
    from tuner.traffic.workload import Workload

#: What a trial scores at its edge (:data:`tuner.serving.slo.OBJECTIVES`, with their units).
OBJECTIVES = tuple(OBJECTIVE_UNITS)


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


def evaluate(ctx: TrialContext, config: ServeConfig, *, incumbent: float | None = None,
                    start_level: float | None = None, expected_value: float | None = None,
                    itl_tail_s: float | None = None) -> Evaluation:
    """Score ``config`` where ``ctx`` says (its backend, deployment, workload, service levels
    and settings; see the module docstring). Raises only for backend crashes
    (:class:`~tuner.core.errors.BackendError` and the like); refusals are results.

    ``incumbent`` is the best value the study has so far: once a passing load is found,
    refining stops when even the failing load above it could not beat the incumbent.
    ``start_level`` (a predicted load, :mod:`tuner.search.prediction`) is the first load tried
    instead of the most the configuration holds; ``expected_value`` (the predicted
    tokens/s) stops refining a passing load of a configuration not expected to come
    within reach of the incumbent. ``itl_tail_s`` (the study's inter-token tail) tells a
    replay whose every stream stalled at once (:class:`~tuner.core.errors.Disrupted`, raised).
    With ``ctx.settings.start_refused`` a configuration the memory planner predicts vLLM will
    refuse for memory is started anyway, and the start's outcome is recorded beside the
    prediction (:mod:`tuner.search.refusal`)."""
    slo = ctx.slo
    rec = TrialRecord(config=config, target_ttft_s=slo.target_ttft_s, slos=() if slo.only_ttft else slo.texts)
    started = _start(ctx, config, rec)
    if isinstance(started, Evaluation):
        return started
    instance, rec, facts, info = started
    startup_s = float(info.get("startup_s") or 0.0)
    cap = max_users(facts, info, config, ctx.workload)
    try:
        with instance:
            points = goodput_search(instance, ctx, top=cap, incumbent=incumbent, start=start_level,
                                    expected=expected_value, ceiling=max(1, len(ctx.workload) // 2),
                                    itl_tail_s=itl_tail_s)
    except ConfigRejected as err:  # e.g. a request the max-model-len cannot hold
        return rejected(rec, err, launched=True, gpu_s=startup_s, slos=slo)
    gpu_s = startup_s + sum(p.result.duration_s for p in points)
    rec = _with_loads(rec, points, gpu_s)
    if not any(p.passed for p in points):
        return _infeasible(slo, rec, points, gpu_s)
    return _feasible(ctx, rec, points, cap, gpu_s)


def evaluate_config(backend: Backend, deployment: Deployment, config: ServeConfig, workload: Workload,
                    slo: float | str | SloSet, *, load_kind: str = "concurrency", observer: Observer | None = None,
                    incumbent: float | None = None, start_level: float | None = None,
                    expected_value: float | None = None, itl_tail_s: float | None = None,
                    **settings: Any) -> Evaluation:
    """:func:`evaluate` of ``config`` on ``backend`` and ``deployment``, replaying ``workload``
    under ``slo`` (a P95 TTFT target in seconds, SLO text(s) or a :class:`SloSet`), offered as
    ``load_kind``, measured with ``settings`` (fields of
    :class:`~tuner.search.settings.SearchSettings`: ``max_replays=``, ``precheck=``, ...):
    one measurement outside a study (tests, benchmarks, the fleet planner)."""

    ctx = TrialContext(backend, deployment, workload, SloSet.of(slo), load_kind, SearchSettings(**settings),
                       observer)
    return evaluate(ctx, config, incumbent=incumbent, start_level=start_level, expected_value=expected_value,
                    itl_tail_s=itl_tail_s)


def _start(ctx: TrialContext, config: ServeConfig,
           rec: TrialRecord) -> Evaluation | tuple[Any, TrialRecord, dict[str, Any], dict[str, Any]]:
    """The pre-check and the start: the started instance with the record so far, the
    planner's facts and what the start reported; or the refusal, as an :class:`Evaluation`."""
    backend, deployment, s, obs = ctx.backend, ctx.deployment, ctx.settings, ctx.obs
    facts: dict[str, Any] = {}
    launched = 0.0
    try:
        if s.precheck:
            obs.on_phase("pre-check")
            facts = {**planner_precheck(deployment, config, start_refused=s.start_refused),
                     **(backend.precheck(deployment, config) or {})}
            rec = rec.replace(run=RunFacts(plan=json_safe(facts)))
        obs.on_phase("starting")
        launched = time.perf_counter()
        instance = backend.start(deployment, config)
    except ConfigRejected as err:
        # a real refused start cost its wall time on the GPUs; the simulator's costs nothing
        spent = time.perf_counter() - launched if launched and backend.measures_gpu_time else 0.0
        return rejected(judged(rec, err, obs), err, launched=bool(launched), gpu_s=spent, slos=ctx.slo)
    info = dict(getattr(instance, "info", {}) or {})
    rec = judged(rec, info, obs)
    rec = rec.replace(run=rec.run.replace(
        startup_s=float(info.get("startup_s") or 0.0), log_paths=tuple(json_safe(info.get("log_paths") or [])),
        vllm_version=info.get("vllm_version") or deployment.vllm_version))
    return instance, rec, facts, info


def _with_loads(rec: TrialRecord, points: list[LoadPoint], gpu_s: float) -> TrialRecord:
    """``rec`` with every load point the goodput search measured, and its lowest load's P95."""
    lowest = min(points, key=lambda p: p.level)
    return rec.replace(
        gpu_s=gpu_s, loads=tuple(LoadRecord.from_dict(json_safe({
            "load": p.load.label, "level": p.level, "p95_ttft_s": p.summary.get("ttft_p95_s"),
            "tokens_per_s": p.summary.get("tokens_per_s"), "error_rate": p.summary.get("error_rate"),
            "errors": p.errors, "duration_s": p.result.duration_s, "stopped_early": p.result.stopped_early,
            "passed": p.passed})) for p in points),
        p95_ttft_at_lowest_load_s=json_safe(lowest.summary.get("ttft_p95_s")), lowest_load=lowest.load.label,
    )


def _infeasible(slo: SloSet, rec: TrialRecord, points: list[LoadPoint], gpu_s: float) -> Evaluation:
    """No load met the service levels: why (errors, the miss at the lowest load, or nothing
    completed), with the lowest load's figures and one constraint per SLO."""
    lowest = min(points, key=lambda p: p.level)
    over = lowest.severity if math.isfinite(lowest.severity) else 2.0
    constraint, floor = over - 1.0, None
    if lowest.failed_by_errors:
        # errors failed the load, whatever its latencies (those of the few requests served)
        reason = lowest.error_reason()
        if not slo.meets({**lowest.summary, "error_rate": 0.0}) and math.isfinite(lowest.severity):
            reason += f"; {slo.over_text(lowest.summary)} too"
        constraint, floor = max(constraint, 1.0), 1.0
    elif math.isfinite(lowest.severity):
        reason = (f"{slo.over_text(lowest.summary)} even at {lowest.load.label}"
                  + (" (replay stopped early: >5% of requests already over)" if lowest.result.stopped_early else ""))
    else:
        reason = f"no request completed at {lowest.load.label}"
    constraints = slo.constraints(slo.ratios(lowest.summary), floor)
    rec = rec.replace(
        feasible=False, constraint=constraint, infeasible_reason=reason,
        failed_by="errors" if lowest.failed_by_errors else "latency",
        summary=json_safe(lowest.summary), server=json_safe(redact_value(lowest.result.server)),
        tokens_per_s=0.0, output_tokens_per_s=0.0, **error_fields(lowest),
        **json_safe(slo.fields(lowest.summary, constraints)),
    )
    return Evaluation(False, 0.0, constraint, rec, gpu_s, {} if slo.only_ttft else constraints)


def _feasible(ctx: TrialContext, rec: TrialRecord, points: list[LoadPoint], cap: int, gpu_s: float) -> Evaluation:
    """The most load that met the service levels: its figures, where its edge lies (and
    whether it was located within the tolerance), scored in the study's objective."""
    s, slo, closed = ctx.settings, ctx.slo, ctx.load_kind == "concurrency"
    best = max((p for p in points if p.passed), key=lambda p: p.level)
    above = [p for p in points if not p.passed and p.level > best.level and p.level != math.inf]
    failing = min(above, key=lambda p: p.level) if above else None
    summary = best.summary
    constraints = slo.constraints(slo.ratios(summary))
    rec = rec.replace(
        edge=Edge(**json_safe({
            "level": best.level, "failing_level": failing.level if failing else None,
            "located": failing is not None
            and failing.level - best.level <= edge_width(best.level, ctx.load_kind, s.edge_tolerance),
            "tolerance": s.edge_tolerance, "cap": cap if closed else None,
            "beyond_cap": closed and best.level > cap})),
        feasible=True, constraint=best.severity - 1.0, **json_safe(slo.fields(summary, constraints)),
        summary=json_safe(summary), server=json_safe(redact_value(best.result.server)),
        tokens_per_s=float(summary["tokens_per_s"]), output_tokens_per_s=float(summary["output_tokens_per_s"]),
        error_rate=float(summary["error_rate"]), chosen_load=best.load.label, **error_fields(best),
    )
    value = float(summary["tokens_per_s"]) if s.objective == "tokens" else float(summary["goodput_requests_per_s"])
    return Evaluation(True, value, rec.constraint, rec, gpu_s, {} if slo.only_ttft else constraints)


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
    constraints = {} if slos is None or slos.only_ttft else slos.constraints(None)
    if constraints:
        rec = rec.replace(constraints=constraints)
    return Evaluation(False, 0.0, 1.0, rec, gpu_s, constraints)

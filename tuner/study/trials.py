"""Reading a study's trials: the feasible, the best, the closest miss, errors, GPU time, a
trial's configuration."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.core.urls import redact
from tuner.study.budget import is_confirmation
from tuner.study.companion import confirmation
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.serving.config import ServeConfig


def is_feasible(trial: FrozenTrial) -> bool:
    from optuna.trial import TrialState

    return trial.state == TrialState.COMPLETE and bool(TrialRecord.from_trial(trial).feasible)


def best_feasible_trial(study: optuna.Study) -> FrozenTrial | None:
    """The study's recommendation: the winner of its confirmation (:func:`confirmation`)
    when one was made on the trials it now holds (None when no candidate held the target
    on every repeat), else the feasible trial with the most
    throughput (ties: the earlier trial; confirmation repeats left out)."""
    trials = study.get_trials(deepcopy=False)
    conf = confirmation(study)
    if conf is not None and not conf.held:
        return None  # no candidate met the target on every repeat: none is recommended
    if conf is not None:
        by_number = {t.number: t for t in trials}
        if conf.winner in by_number and is_feasible(by_number[conf.winner]):
            return by_number[conf.winner]
    feasible = [t for t in trials if is_feasible(t) and not is_confirmation(t)]
    return max(feasible, key=lambda t: (t.value, -t.number), default=None)


def top_feasible_trials(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """The ``k`` best feasible trials, one per configuration (repeats and confirmation
    measurements left out)."""
    feasible = [t for t in study.get_trials(deepcopy=False)
                if is_feasible(t) and not TrialRecord.from_trial(t).is_repeat and not is_confirmation(t)]
    return sorted(feasible, key=lambda t: (-t.value, t.number))[:k]


def closest_miss(study: optuna.Study) -> FrozenTrial | None:
    """The trial that missed the target by the least: smallest P95 TTFT overshoot among
    the trials that latency failed; else the first one that errors failed (too many
    requests failed); else the first config the planner rejected."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if not is_feasible(t)]
    records = {t.number: TrialRecord.from_trial(t) for t in done}
    measured = [t for t in done if records[t.number].p95_ttft_at_lowest_load_s is not None
                and records[t.number].failed_by != "errors"]
    if measured:
        return min(measured, key=lambda t: (records[t.number].p95_ttft_at_lowest_load_s, t.number))
    by_errors = [t for t in done if records[t.number].failed_by == "errors"]
    if by_errors:
        return by_errors[0]
    return done[0] if done else None


def error_totals(study: optuna.Study) -> dict[str, int]:
    """Failed requests per error kind over every load point of every trial that ran
    (repeats of an earlier trial counted once), most first."""
    from optuna.trial import TrialState

    totals: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        rec = TrialRecord.from_trial(t)
        if rec.is_repeat:
            continue
        for point in rec.loads:
            for kind, n in point.errors.items():
                totals[str(kind)] = totals.get(str(kind), 0) + int(n)
    return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))


def gpu_time(study: optuna.Study) -> dict[str, float]:
    """Seconds the study's servers held the deployment's GPUs: ``start_s`` (starting them,
    refused starts included: that is a configuration's answer), ``replay_s`` (the measured
    loads), ``wasted_s`` (trials that measured nothing: interrupted, environment faults,
    crashes), ``wasted_trials`` and ``total_s``. Copies of a measurement cost nothing."""
    from optuna.trial import TrialState

    out = {"start_s": 0.0, "replay_s": 0.0, "wasted_s": 0.0, "wasted_trials": 0.0}
    for t in study.get_trials(deepcopy=False):
        rec = TrialRecord.from_trial(t)
        if rec.repeat_of is not None:
            continue
        if t.state == TrialState.FAIL:
            if rec.gpu_s:
                out["wasted_s"] += float(rec.gpu_s)
                out["wasted_trials"] += 1
            continue
        replay = sum(float(p.duration_s or 0.0) for p in rec.loads)
        out["replay_s"] += replay
        out["start_s"] += max(0.0, float(rec.gpu_s or 0.0) - replay) if rec.gpu_s else float(rec.run.startup_s or 0.0)
    out["total_s"] = out["start_s"] + out["replay_s"] + out["wasted_s"]
    return out


def miss_explanation(trial: FrozenTrial) -> str:
    """One line: why this trial was infeasible, and by how much it missed (for one that
    errors failed: how many requests failed, of which kinds)."""

    rec = TrialRecord.from_trial(trial)
    target = rec.target_ttft_s
    p95 = rec.p95_ttft_at_lowest_load_s
    if rec.failed_by == "errors":
        return f"trial {trial.number}: {redact(str(rec.infeasible_reason))}"
    if p95 is not None and target:
        load = rec.lowest_load or "the lowest load"
        return (
            f"trial {trial.number} came closest: P95 TTFT {p95:.3g} s at {load} vs the {target:.3g} s "
            f"target ({p95 - target:+.3g} s, {p95 / target - 1:+.0%})"
        )
    return f"trial {trial.number}: {redact(rec.infeasible_reason or 'no measurement')}"


def trial_config(trial: FrozenTrial) -> ServeConfig:
    """The :class:`ServeConfig` a trial ran."""
    config = TrialRecord.from_trial(trial).config
    if config is None:
        raise InputError(f"trial {trial.number} stores no config (not written by tuner search?)")
    return config

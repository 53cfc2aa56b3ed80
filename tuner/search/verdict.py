"""Verdicts near the target, measured on a second start before they are stored.

On real vLLM every TTFT of one server start shares a factor that differs between starts
by about 10 % (the H200 campaign). A trial's verdict, met the target or not, turns on one
start: a configuration whose P95 TTFT sits a few percent under the target draws a slow
start about one time in three, misses at every load the search tries, and was stored
with value 0, its verdict final (a re-proposal copied it). Issue 49 saw the best cluster of
one space lost three times in a run this way (the recommendation 92.8 % of the optimum).

* :func:`verdict_p95` — the P95 a verdict turned on: a miss's at the lowest load it tried;
  a pass's only at one user per replica (no lower load to fall back to,
  :func:`tuner.search.boundary.lowest_p95`): elsewhere a lower load holds its margin.
* :func:`study_ttft_sd` — the study's own per-start TTFT noise: the pairs of starts its
  re-measured verdicts made at one load, pooled with the backend's prior.
* :func:`settle` — a verdict whose P95 lies within that noise band of the target
  (:func:`~tuner.study.noise.near_target`) is measured on a second fresh start (the same
  sample) and the two are weighed together (:func:`combine`): it met the target unless
  no start did or their P95s say with confidence that it misses
  (:func:`~tuner.study.noise.misses_with_confidence`, the race's test). The sampler is told
  the verdict with its uncertainty: the constraint from the starts' P95s (their geometric
  mean over the target, - 1), and a miss within the noise the tokens/s it served at its
  lowest load, not a 0 that teaches "bad". Where starts do not vary (a simulated backend
  replays one sample the same on every start) nothing is measured twice.
* :func:`copy_source` — a verdict still within the noise after two starts is not final: a
  re-proposal of the configuration is measured again, up to :data:`MEASURED_AT_MOST` trials.
* :func:`start_p95s` — the P95s of every start a trial made, as the race weighs them.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tuner.search.boundary import lowest_p95
from tuner.search.objective import CONSTRAINT, Evaluation
from tuner.study.noise import PRIOR_DOF, misses_with_confidence, near_target, ttft_sd
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

#: Trials of one configuration (each of one or two starts) after which its verdict is final
#: even within the noise of the target: a re-proposal copies the latest.
MEASURED_AT_MOST = 2


def start_p95(rec: TrialRecord) -> float | None:
    """One start's P95 TTFT: at its scored load where it met the target, at its lowest load
    where it missed (what it missed by)."""
    value = (rec.summary or {}).get("ttft_p95_s") if rec.feasible else rec.p95_ttft_at_lowest_load_s
    return float(value) if value is not None and value > 0 else None


def verdict_p95(rec: TrialRecord) -> float | None:
    """The P95 TTFT ``rec``'s verdict turned on (see the module docstring), or None: a pass
    above one user per replica, a refusal, a miss by errors or by an SLO other than P95 TTFT."""
    if rec.slos and not str(rec.binding_slo or "").startswith("p95:ttft"):
        return None
    if rec.feasible:
        return lowest_p95(rec)
    if rec.feasible is None or rec.failed_by != "latency" or rec.rejected_kind:
        return None
    return start_p95(rec)


def study_ttft_sd(trials: Iterable[Any], simulated: bool) -> float:
    """Relative sd of one start's P95 TTFT: the study's re-measured verdicts (two starts of
    one configuration on one sample, their P95s at the lowest load both measured: the log
    ratio's variance is twice a start's) pooled with the backend's prior
    (:func:`~tuner.study.noise.ttft_sd`, :data:`~tuner.study.noise.PRIOR_DOF` degrees of freedom)."""
    ss, dof = 0.0, 0
    for t in trials:
        d = (TrialRecord.from_trial(t).verdict or {}).get("pair_log_ratio")
        if d is not None:
            ss, dof = ss + float(d) ** 2 / 2, dof + 1
    prior = ttft_sd(simulated)
    return math.sqrt((PRIOR_DOF * prior**2 + ss) / (PRIOR_DOF + dof))


def _pair(a: TrialRecord, b: TrialRecord) -> float | None:
    """log(P95 of ``a`` / P95 of ``b``) at the lowest load both measured in full, or None."""
    def p95s(rec: TrialRecord) -> dict[float, float]:
        return {float(p.level): float(p.p95_ttft_s) for p in rec.loads
                if p.level is not None and p.p95_ttft_s and not p.stopped_early}

    pa, pb = p95s(a), p95s(b)
    common = sorted(set(pa) & set(pb))
    return math.log(pa[common[0]] / pb[common[0]]) if common else None


def _held_value(rec: TrialRecord, objective: str) -> float:
    """What a start that missed served at its lowest load: its value had it held there."""
    key = "tokens_per_s" if objective == "tokens" else "goodput_requests_per_s"
    return float((rec.summary or {}).get(key) or 0.0)


def _start(ev: Evaluation, objective: str) -> dict[str, Any]:
    rec = ev.record
    return {"feasible": bool(ev.feasible), "value": ev.value if ev.feasible else _held_value(rec, objective),
            "p95_s": start_p95(rec), "floor_p95_s": lowest_p95(rec), "load": rec.chosen_load or rec.lowest_load,
            "gpu_s": ev.gpu_s}


def combine(first: Evaluation, second: Evaluation, target: float, sd: float, objective: str = "tokens") -> Evaluation:
    """The verdict of two starts of one configuration (see the module docstring)."""
    starts = [_start(first, objective), _start(second, objective)]
    weighed = [s["p95_s"] for s in starts if s["p95_s"] is not None]
    passed = [ev for ev in (first, second) if ev.feasible]
    sure_miss = len(weighed) < len(starts) or misses_with_confidence(weighed, target, sd)
    feasible = bool(passed) and (len(passed) == len(starts) or not sure_miss)
    central = statistics.geometric_mean(weighed) / target - 1.0 if weighed else 1.0
    if feasible:
        told, base = central, passed[0]
        value = statistics.geometric_mean([ev.value for ev in passed]) if len(passed) > 1 else passed[0].value
    else:
        told = central if central > 0 else (max(weighed) / target - 1.0 if weighed else 1.0)
        base = first if not first.feasible else second
        value = 0.0 if sure_miss else statistics.geometric_mean([max(s["value"], 1e-9) for s in starts])
    note = {"starts": starts, "constraint": told, "ttft_sd": sd, "near": not sure_miss,
            "pair_log_ratio": _pair(first.record, second.record)}
    rec = base.record.replace(verdict=note, gpu_s=first.gpu_s + second.gpu_s)
    if feasible and objective == "tokens":
        rec = rec.replace(tokens_per_s=value)
    if not feasible:
        other = starts[1] if base is first else starts[0]
        rec = rec.replace(infeasible_reason=f"{base.record.infeasible_reason}; {_other_text(other, target, sure_miss)}")
    named = {**base.constraints, CONSTRAINT: told} if base.constraints else {}
    return Evaluation(feasible, value, told, rec, first.gpu_s + second.gpu_s, named)


def _other_text(other: dict[str, Any], target: float, sure_miss: bool) -> str:
    """``on another start: P95 TTFT 3.31 s at 32 users (both within a start's noise of the 3.28 s target)``."""
    shown = "no P95 TTFT" if other["p95_s"] is None else f"P95 TTFT {other['p95_s']:.3g} s at {other['load']}"
    if other["feasible"]:
        shown = f"met the target ({shown})"
    why = "the P95s miss the target with confidence" if sure_miss else f"both within a start's noise of the {target:g} s target"  # noqa: E501
    return f"on another start: {shown} ({why})"


def needs_second_start(rec: TrialRecord, target: float, sd: float) -> bool:
    """Whether ``rec``'s verdict lies within a start's noise band of ``target`` (and was not measured twice yet)."""
    p95 = verdict_p95(rec)
    return rec.verdict is None and p95 is not None and near_target(p95, target, sd)


def settle(first: Evaluation, measure: Callable[[], Evaluation], target: float, *, sd: float, starts_vary: bool,
           objective: str = "tokens") -> Evaluation:
    """``first``, or its verdict weighed with a second start's (``measure()``) where it lies
    within the noise band of ``target`` and starts vary (see the module docstring)."""
    if not starts_vary or not needs_second_start(first.record, target, sd):
        return first
    return combine(first, measure(), target, sd, objective)


def copy_source(study: optuna.Study, earlier: FrozenTrial | None) -> FrozenTrial | None:
    """The trial a re-proposal of ``earlier``'s configuration copies (the latest of its trials),
    or None where none is and it is measured again: no trial, or every one missed the
    target within a start's noise (after two starts) and fewer than :data:`MEASURED_AT_MOST` were made."""
    from optuna.trial import TrialState

    if earlier is None:
        return None
    rec = TrialRecord.from_trial(earlier)
    same = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if (r := TrialRecord.from_trial(t)).config == rec.config and not r.is_repeat and not r.is_confirmation
            and r.run.workload_fingerprint == rec.run.workload_fingerprint]
    latest = max(same, key=lambda t: t.number, default=earlier)
    near_miss = [TrialRecord.from_trial(t) for t in same]
    if len(same) < MEASURED_AT_MOST and all(r.feasible is False and (r.verdict or {}).get("near") for r in near_miss):
        return None
    return latest


def start_p95s(rec: TrialRecord) -> tuple[list[float], list[float]]:
    """The P95 TTFT of each start ``rec`` made (:func:`start_p95`; two where its verdict was
    measured again), and those at one user per replica (:func:`~tuner.search.boundary.lowest_p95`)."""
    if not rec.verdict:
        return [p for p in [start_p95(rec)] if p is not None], [p for p in [lowest_p95(rec)] if p is not None]
    starts = rec.verdict.get("starts") or []
    return ([float(s["p95_s"]) for s in starts if s.get("p95_s")],
            [float(s["floor_p95_s"]) for s in starts if s.get("floor_p95_s")])


__all__ = ["MEASURED_AT_MOST", "combine", "copy_source", "needs_second_start", "settle", "start_p95", "start_p95s",
           "study_ttft_sd", "verdict_p95"]

"""How sure a pass at the lowest load is: what the sampler is told of a configuration whose
P95 TTFT lies within the noise of the target.

On real vLLM every TTFT of one server start shares a factor that differs between starts
by about 10 % (the H200 campaign, benchmarks/h200/README.md): a configuration whose true
P95 at its lowest load sits 5-10 % over the target passes on a lucky start, scores its
(high) tokens/s, and a sampler taught that as a sure success piles onto it. Where the
load can go no lower, no search of the edge can buy margin: what decides is the start.

* :func:`lowest_p95` — the P95 TTFT of a trial's lowest load, when that load is in the
  regime the search cannot go below (closed loop, at most one user per replica: every
  request alone on its server); None elsewhere (a lower load, not measured, could pass).
* :func:`upper_p95` — a pessimistic estimate of the true P95 there, from the measured
  P95s (one per start) and the per-start noise prior (:func:`ttft_sd`): the geometric
  mean x exp(:data:`tuner.confirmation.Z_FEASIBLE` x sd / sqrt(n)).
* :func:`feasibility` — the probability that the true P95 there meets the target.
* :func:`sampler_constraint` — the Optuna constraint of a trial that met the target:
  ``upper_p95 / target - 1`` where that is > 0 (not a sure success), else None (the
  measured one stands). Such a trial does not set the incumbent either
  (:func:`unsure`).

The noise prior is keyed by the backend's ``simulated`` capability, never its name.
"""
from __future__ import annotations

from typing import Any

from tuner.confirmation import feasibility, ttft_sd, upper_p95


def lowest_p95(rec: Any) -> float | None:
    """The P95 TTFT of ``rec``'s (a TrialRecord's) lowest load when the search could go
    no lower (closed loop, at most one user per replica); None otherwise."""
    if rec.run.load_kind != "concurrency" or not rec.loads or rec.config is None:
        return None
    points = [p for p in rec.loads if p.level is not None and p.p95_ttft_s is not None]
    if not points:
        return None
    lowest = min(points, key=lambda p: p.level)
    replicas = max(int(rec.config.replicas or 1), 1)
    return float(lowest.p95_ttft_s) if lowest.level <= replicas else None


def sampler_constraint(rec: Any, target_s: float, simulated: bool) -> float | None:
    """The P95 TTFT constraint the sampler gets for a trial that met ``target_s``: the
    pessimistic margin where it is > 0, else None (the trial's own constraint stands)."""
    if not rec.feasible or (p95 := lowest_p95(rec)) is None:
        return None
    over = upper_p95([p95], simulated) / target_s - 1.0
    return over if over > 0 else None


def unsure(trial: Any) -> bool:
    """A trial that met the target only within the noise of a start (its record's
    ``boundary`` says so): not the incumbent the next trials refine against."""
    from tuner.record import TrialRecord

    return TrialRecord.from_trial(trial).boundary is not None


def incumbent(study: Any) -> Any:
    """The best trial that met the target surely (not :func:`unsure`, not a confirmation
    repeat): what the next trials refine against and start their search at."""
    from tuner.study import is_confirmation, is_feasible

    trials = [t for t in study.get_trials(deepcopy=False) if is_feasible(t) and not is_confirmation(t)
              and not unsure(t)]
    return max(trials, key=lambda t: (t.value, -t.number), default=None)


__all__ = ["incumbent", "feasibility", "lowest_p95", "sampler_constraint", "ttft_sd", "unsure", "upper_p95"]

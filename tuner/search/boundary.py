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
  mean x exp(:data:`tuner.study.race.Z_FEASIBLE` x sd / sqrt(n)).
* :func:`feasibility` — the probability that the true P95 there meets the target.
* :func:`objective_sd` — the noise of one measurement of the objective (tokens/s at the
  edge): a start's TTFT factor moves the edge along the trial's own P95-vs-load curve, so
  the objective varies by the curve's slope x the TTFT noise, beside the tokens/s noise.
* :func:`sampler_constraint` — the Optuna constraint of a trial that met the target:
  ``upper_p95 / target - 1`` where that is > 0 (not a sure success), else None (the
  measured one stands). Such a trial does not set the incumbent either
  (:func:`unsure`).

The noise prior is keyed by the backend's ``simulated`` capability, never its name.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from tuner.study import is_confirmation, is_feasible
from tuner.study.race import feasibility, prior_sd, ttft_sd, upper_p95
from tuner.study.record import TrialRecord


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


def _chord(a: Any, b: Any, by_level: bool = False) -> float | None:
    """d log(tokens/s) / d log(P95) from load point ``a`` to ``b`` (``by_level``: the loads'
    ratio stands for the tokens/s ratio, where ``b``'s replay stopped early and its
    tokens/s counts only the requests that finished by then)."""
    rise = math.log(b.p95_ttft_s / a.p95_ttft_s)
    gain = math.log(b.level / a.level) if by_level else math.log(b.tokens_per_s / a.tokens_per_s)
    return gain / rise if rise > 0 else None


def edge_slope(rec: Any) -> float | None:
    """How the objective of ``rec`` (a TrialRecord) moves with the P95 TTFT it is held to:
    d log(tokens/s) / d log(P95 TTFT) along its own measured curve, from its edge (the most
    load that passed) to the failing load above it. A start whose TTFTs all run x f lower
    passes the target where P95 is target / f: its edge moves along that curve. P95 grows
    convexly with load and tokens/s concavely, so the curve flattens with load: the chord
    from a lower passing load to the edge is steeper than the edge's own slope, and the
    smaller of the two chords is taken (a curve measured far below the edge does not widen
    the noise). None where the edge is not bracketed by two measured loads (held at
    its cap, or nothing passed): a start's TTFT does not move it."""
    points = [p for p in rec.loads if p.level and p.p95_ttft_s and p.tokens_per_s]
    passing = sorted((p for p in points if p.passed), key=lambda p: p.level)
    if not passing:
        return None
    edge = passing[-1]
    above = [p for p in points if not p.passed and p.level > edge.level]
    if not above:
        return None
    fail = min(above, key=lambda p: p.level)
    slopes = [_chord(edge, fail, by_level=fail.stopped_early)]
    if len(passing) > 1 and passing[0].level < edge.level:
        slopes.append(_chord(passing[0], edge))
    known = [max(x, 0.0) for x in slopes if x is not None]
    return min(known) if known else None


def objective_sd(rec: Any, simulated: bool) -> float:
    """Relative sd of one measurement of ``rec``'s objective on a fresh start: the tokens/s
    noise (:func:`~tuner.study.race.prior_sd`) and the edge's move with a start's TTFT
    factor (:func:`edge_slope` x :func:`~tuner.study.race.ttft_sd`), independent."""
    slope = edge_slope(rec) or 0.0
    return math.hypot(prior_sd(simulated), slope * ttft_sd(simulated))


def study_objective_sd(records: Iterable[Any], simulated: bool) -> float:
    """The noise prior of a study's race: the median :func:`objective_sd` over ``records``
    (the feasible trials raced from), the tokens/s prior alone when there are none."""
    sds = [objective_sd(r, simulated) for r in records]
    return statistics.median(sds) if sds else prior_sd(simulated)


def sampler_constraint(rec: Any, target_s: float, simulated: bool) -> float | None:
    """The P95 TTFT constraint the sampler gets for a trial that met ``target_s``: the
    pessimistic margin where it is > 0, else None (the trial's own constraint stands). A
    verdict measured on two starts (:mod:`tuner.search.verdict`) is estimated from both."""
    if not rec.feasible or (p95 := lowest_p95(rec)) is None:
        return None
    p95s = [float(s["floor_p95_s"]) for s in (rec.verdict or {}).get("starts", []) if s.get("floor_p95_s")] or [p95]
    over = upper_p95(p95s, simulated) / target_s - 1.0
    return over if over > 0 else None


def doubtful(rec: Any) -> bool:
    """A record that met the target only within the noise of a start: a ``boundary`` pass,
    or a verdict whose two starts disagreed (:mod:`tuner.search.verdict`)."""
    return rec.boundary is not None or any(not s.get("feasible") for s in (rec.verdict or {}).get("starts", []))


def unsure(trial: Any) -> bool:
    """A trial that met the target only within the noise of a start (:func:`doubtful`): not
    the incumbent the next trials refine against."""

    return doubtful(TrialRecord.from_trial(trial))


def incumbent(study: Any) -> Any:
    """The best trial that met the target surely (not :func:`unsure`, not a confirmation
    repeat): what the next trials refine against and start their search at."""

    trials = [t for t in study.get_trials(deepcopy=False) if is_feasible(t) and not is_confirmation(t)
              and not unsure(t)]
    return max(trials, key=lambda t: (t.value, -t.number), default=None)


__all__ = ["doubtful", "edge_slope", "incumbent", "feasibility", "lowest_p95", "objective_sd", "study_objective_sd", "sampler_constraint", "ttft_sd", "unsure", "upper_p95"]  # noqa: E501

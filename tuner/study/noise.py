"""Run-to-run noise of one measurement, and how sure a pass at the target is.

* :class:`NoiseFloor` — the relative sd of one measurement of the objective, and the band
  two means of it can differ by through noise alone (:data:`Z` x sd x sqrt(1/n1 + 1/n2)).
* :func:`noise_floor` — pooled over configurations measured more than once, shrunk toward
  a prior (:func:`prior_sd`, or a study's own: :func:`tuner.search.boundary.objective_sd`).
* :func:`paired_noise` — the same for configurations measured on the same samples: what a
  sample does to every configuration alike cancels (two-way, no interaction).
* :func:`ttft_sd`, :func:`upper_p95`, :func:`feasibility` — the P95 TTFT of one server
  start varies by a factor shared by all its replays (real vLLM: ~10 %): a pessimistic
  estimate of the true P95 and the probability that it meets a target.
* :func:`near_target`, :func:`misses_with_confidence` — whether one P95 lies within a
  start's noise band of the target, and whether several (one per start) say with
  confidence that the configuration misses it (a one-sided test against the per-start noise).

Priors are keyed by the backend's ``simulated`` capability (:mod:`tuner.search.backend`),
never its name. Pure: no study, no backend.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: z of the bands: two means differ by noise alone less often than ~1 in 40 (one-sided).
Z = 2.0
#: Relative sd of one tokens/s measurement before a study has repeats: real vLLM, the
#: fresh-restart replicates of the H200 campaign (1.3 % at low load, up to 3 % near the
#: edge; benchmarks/h200/README.md); the simulator only varies with the sample (~1 %).
#: Keyed by the backend's ``simulated`` capability (:mod:`tuner.search.backend`), never its name.
SIMULATED_PRIOR_SD = 0.01
DEFAULT_PRIOR_SD = 0.02
#: Weight of the prior, in degrees of freedom, against the study's own repeats.
PRIOR_DOF = 2
#: One-sided z of a pessimistic P95 TTFT estimate (:func:`upper_p95`): the true P95 exceeds it about 1 time in 10.
Z_FEASIBLE = 1.2816
#: Relative sd of P95 TTFT between server starts: real vLLM (the H200 campaign: P95 TTFT
#: of fresh starts of one configuration up to 10 % apart); the simulator varies only
#: with the order of the requests.
TTFT_PRIOR_SD = 0.10
SIMULATED_TTFT_SD = 0.02


def ttft_sd(simulated: bool) -> float:
    return SIMULATED_TTFT_SD if simulated else TTFT_PRIOR_SD


def upper_p95(p95s: Sequence[float], simulated: bool, z: float = Z_FEASIBLE) -> float:
    """Pessimistic estimate of the true P95 from ``p95s`` (one per server start)."""
    logs = [math.log(p) for p in p95s if p > 0]
    if not logs:
        return math.inf
    return math.exp(statistics.fmean(logs) + z * ttft_sd(simulated) / math.sqrt(len(logs)))


def feasibility(p95s: Sequence[float], target_s: float, simulated: bool) -> float:
    """Probability that the true P95 meets ``target_s``, given ``p95s`` (one per start)
    and the per-start noise prior (lognormal)."""
    logs = [math.log(p) for p in p95s if p > 0]
    if not logs:
        return 0.0
    sd = ttft_sd(simulated) / math.sqrt(len(logs))
    return statistics.NormalDist().cdf((math.log(target_s) - statistics.fmean(logs)) / sd)


def near_target(p95: float, target_s: float, sd: float, z: float = Z) -> bool:
    """Whether one start's P95 lies within the noise band of ``target_s``: another start (its
    TTFTs x exp(N(0, ``sd``))) could land on the other side of it, |log(P95 / target)| <= z x sd."""
    return p95 > 0 and abs(math.log(p95 / target_s)) <= z * sd


def misses_with_confidence(p95s: Sequence[float], target_s: float, sd: float) -> bool:
    """Whether ``p95s`` (one per start: where it met the target, the P95 there; where it
    missed, at the lowest load it tried) say with confidence that the configuration misses
    ``target_s``, one-sided against the per-start noise ``sd``: the probability that its
    true P95 meets the target (:func:`feasibility`'s, from their mean) under 1 in 10 (the
    mean log P95 over the target by more than :data:`Z_FEASIBLE` x sd / sqrt(n)), or one
    P95 beyond the band no start's TTFT factor draws (over it by more than :data:`Z` x sd:
    ~1 in 40). One miss within a start's noise beside passes is not enough."""
    logs = [math.log(p / target_s) for p in p95s if p > 0]
    if not logs:
        return False
    return statistics.fmean(logs) > Z_FEASIBLE * sd / math.sqrt(len(logs)) or max(logs) > Z * sd


@dataclass(frozen=True, slots=True)
class NoiseFloor:
    """Run-to-run noise of one tokens/s measurement, relative (0.02 = 2 %)."""

    rel_sd: float
    dof: int = 0            # degrees of freedom of the study's own repeats
    source: str = "prior"   # "prior", or "repeats" once the study has any

    def band(self, n1: int = 1, n2: int = 1) -> float:
        """The relative gap two means of ``n1`` and ``n2`` measurements can show by noise."""
        return Z * self.rel_sd * math.sqrt(1 / max(n1, 1) + 1 / max(n2, 1))

    def to_dict(self) -> dict[str, Any]:
        return {"rel_sd": self.rel_sd, "dof": self.dof, "source": self.source}


def prior_sd(simulated: bool) -> float:
    """The prior of :func:`noise_floor` for a backend whose numbers are (not) the simulator's."""
    return SIMULATED_PRIOR_SD if simulated else DEFAULT_PRIOR_SD


def noise_floor(groups: Iterable[Sequence[float]], simulated: bool = False, prior: float | None = None) -> NoiseFloor:
    """Pooled relative sd over ``groups`` (the tokens/s measurements of one configuration
    each; groups of one measurement add nothing), shrunk toward the backend's prior (:func:`prior_sd`) with
    :data:`PRIOR_DOF` degrees of freedom (``prior``: a study's own prior instead, e.g. the
    objective's noise from the edge's sensitivity to a start's TTFT,
    :func:`tuner.search.boundary.objective_sd`). Zero measurements (a configuration that failed
    its target on a repeat) are left out: they are not noise around a value."""
    ss, dof = 0.0, 0
    for values in groups:
        logs = [math.log(v) for v in values if v and v > 0]
        if len(logs) < 2:
            continue
        mean = statistics.fmean(logs)
        ss += sum((x - mean) ** 2 for x in logs)
        dof += len(logs) - 1
    prior = prior_sd(simulated) if prior is None else prior
    if not dof:
        return NoiseFloor(prior, 0, "prior")
    sd = math.sqrt((PRIOR_DOF * prior**2 + ss) / (PRIOR_DOF + dof))
    return NoiseFloor(sd, dof, "repeats")


def paired_noise(rows: Sequence[Sequence[float]], simulated: bool = False, prior: float | None = None) -> NoiseFloor:
    """The noise of comparisons between configurations measured on the same samples:
    ``rows`` hold each configuration's tokens/s, column ``k`` the ``k``-th sample (the
    same requests, order and seed for every row). What a sample does to every
    configuration alike (a harder order of the requests) cancels in a comparison, so
    the sd is that of the residuals of log value = configuration + sample (two-way,
    no interaction), shrunk toward the prior like :func:`noise_floor`. Fewer than two
    complete rows or columns: :func:`noise_floor` of the rows."""
    k = min((len(r) for r in rows), default=0)
    full = [[math.log(v) for v in r[:k]] for r in rows if all(v > 0 for v in r[:k])]
    if len(full) < 2 or k < 2:
        return noise_floor(rows, simulated, prior)
    c = len(full)
    grand = statistics.fmean(x for r in full for x in r)
    row_mean = [statistics.fmean(r) for r in full]
    col_mean = [statistics.fmean(r[j] for r in full) for j in range(k)]
    ss = sum((full[i][j] - row_mean[i] - col_mean[j] + grand) ** 2 for i in range(c) for j in range(k))
    dof = (c - 1) * (k - 1)
    prior = prior_sd(simulated) if prior is None else prior
    return NoiseFloor(math.sqrt((PRIOR_DOF * prior**2 + ss) / (PRIOR_DOF + dof)), dof, "paired repeats")


__all__ = ["DEFAULT_PRIOR_SD", "PRIOR_DOF", "SIMULATED_PRIOR_SD", "SIMULATED_TTFT_SD", "TTFT_PRIOR_SD", "Z", "Z_FEASIBLE",  # noqa: E501
           "NoiseFloor", "feasibility", "misses_with_confidence", "near_target", "noise_floor", "paired_noise", "prior_sd", "ttft_sd", "upper_p95"]  # noqa: E501

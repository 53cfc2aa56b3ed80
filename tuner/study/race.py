"""Confirming a study's winner: is the best trial better, or only luckier?

One measurement of a configuration's goodput carries run-to-run noise: on a real H200
(vLLM 0.26.0, benchmarks/h200/README.md) fresh restarts of one configuration gave
tokens/s 1-3 % apart and P95 TTFT up to 10 % apart, and configurations that differ only
in knobs without effect scored up to 3 % apart. A study that ranks by single
measurements names a winner inside that noise. So, once a study's budget is spent:

1. **Noise floor** (:func:`noise_floor`): the relative standard deviation of one
   measurement, pooled over every configuration the study measured more than once (a
   prior from the H200 campaign until it has repeats).
2. **Candidates** (:func:`candidates`): the configurations whose measurement lies within
   the noise band of the best one (two single measurements that differ by less than
   :data:`Z` x sd x sqrt(2) may be the same), at most :data:`MAX_CANDIDATES`.
3. **Racing** (:func:`race`): each round measures every candidate still in the race once
   more, all with the same new sample (paired: common random numbers); a candidate whose
   mean falls below the leader's by more than the noise band of the means is out. The
   band's noise is that of paired comparisons (:func:`paired_noise`): what a sample does
   to every configuration alike (a harder order of the requests) cancels.
   After the set rounds, the race goes on (up to ``max_rounds``) while a candidate that
   differs from the leader in a knob that changes speed is still in it
   (:func:`undecided`): with 2 % noise per fresh start, three measurements each cannot
   tell a 2.5 % gap (band 2 x 2 % x sqrt(2/3) = 3.3 %), six can (2.3 %). Ties that differ
   only in headroom knobs are decided by the headroom rule, not by more repeats, and so
   are races whose band is already under 1 % (:data:`SETTLED`).
4. **Decision** (:func:`decide`): the leader is the best mean; its *ties* are the
   candidates the repeats cannot tell from it. Among the ties within
   :data:`EQUIVALENT` of the leader's mean that differ from it only in headroom knobs
   (:func:`headroom_tie`), the one with the most headroom is recommended (lower
   gpu-memory-utilization, then fewer max-num-seqs, then CUDA graphs over eager), and the
   decision says so. A candidate ruled out in the race cannot lead: its mean is over
   fewer samples than those still in.
5. **Feasibility** is confirmed, not assumed: a candidate is out once its repeats say with
   confidence that it misses the target (:func:`~tuner.study.noise.misses_with_confidence`,
   a one-sided test of its P95s against the per-start TTFT noise), whatever its tokens/s;
   one miss within a start's noise beside passes is not enough (issue 49: two optimum
   configurations were put out on one miss of six, the recommendation 95.6 % of the optimum),
   and a miss with no P95 to weigh (it did not start, or failed by errors) is. Its tokens/s
   is the mean of the measurements that met the target. When every
   candidate is out, the race has no winner (``held`` False, :func:`no_holder`) and
   :func:`tuner.search.confirm.confirm_winner` races the next-best configurations; the
   recommendation carries its SLO margin: the worst P95 TTFT of its measurements against
   the target.

Pure: the measurements come from a callable, so the search (fresh server starts) and
``benchmarks/search_quality.py`` (a noisy stand-in) run the same decision.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.serving.slo import value_text
from tuner.study.headroom import HEADROOM_KNOBS, headroom_key, headroom_tie
from tuner.study.headroom import why as _why_headroom
from tuner.study.misses import verdict
from tuner.study.noise import (
    DEFAULT_PRIOR_SD,
    NoiseFloor,
    feasibility,
    noise_floor,
    paired_noise,
    prior_sd,
    ttft_sd,
    upper_p95,
)

#: Configurations raced at most (the best and up to three within its band).
MAX_CANDIDATES = 4
#: Ties within this share of the leader's mean are equivalent: the headroom rule picks.
EQUIVALENT = 0.005
#: A race whose band is this narrow stops at its set rounds: more repeats could only
#: tell gaps under 1 %, the closeness the search's quality is judged by
#: (benchmarks/search_noise.py: "within 1 % of the optimum").
SETTLED = 0.01
#: A candidate whose P95 TTFT at its lowest load lies near the target stays in the race
#: only with a feasibility probability above this (``--feasibility``).
FEASIBILITY = 0.9


@dataclass(slots=True)
class Candidate:
    """A configuration in the race: the trial that first measured it and every value."""

    number: int
    config: dict[str, Any]
    values: list[float] = field(default_factory=list)
    #: Its cap bound at the edge on some measurement (the most load that met the target was
    #: at or above max-num-seqs x replicas, or what its KV cache holds): fewer sequences
    #: are no headroom then.
    capped: bool = False
    #: P95 TTFT (s) of each measurement: at the scored load where it met the target, at its
    #: lowest load where it missed.
    p95s: list[float] = field(default_factory=list)
    #: P95 TTFT (s) of each measurement at its lowest load where that load is one user per
    #: replica or fewer (no lower load exists: tuner.search.boundary.lowest_p95).
    floor_p95s: list[float] = field(default_factory=list)
    #: Its KV cache filled at the edge on some measurement (tuner.study.headroom.kv_filled).
    kv_full: bool = False

    @property
    def passed(self) -> list[float]:
        """The values of the measurements that met the target (a miss is 0)."""
        return [v for v in self.values if v > 0]

    @property
    def count(self) -> int:
        """How many measurements its mean is over."""
        return len(self.passed)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.passed) if self.passed else 0.0

    @property
    def band(self) -> tuple[float, float]:
        return (min(self.passed), max(self.passed)) if self.passed else (0.0, 0.0)


def candidates(measured: Sequence[Candidate], noise: NoiseFloor, limit: int = MAX_CANDIDATES,
               unsure: Iterable[int] = ()) -> list[Candidate]:
    """The configurations whose mean lies within the noise band of the best mean (the
    best first), at most ``limit``. The band is anchored on the best of those not in
    ``unsure`` (trials that met the target only within a start's noise,
    :mod:`tuner.search.boundary`): a lucky pass enters the race, but does not push out
    of it the configurations that met the target surely."""
    ranked = sorted((c for c in measured if c.mean > 0), key=lambda c: (-c.mean, c.number))
    if not ranked:
        return []
    doubtful = set(unsure)
    best = next((c for c in ranked if c.number not in doubtful), ranked[0])
    out = [best]
    for c in ranked:
        if c is best:
            continue
        if len(out) >= limit:
            break
        if best.mean - c.mean <= noise.band(best.count, c.count) * best.mean:
            out.append(c)
    return out


@dataclass(slots=True)
class Confirmation:
    """The decision of :func:`decide`, stored on the study (``to_dict``)."""

    winner: int                          # trial number recommended
    leader: int                          # trial number of the best mean
    band: tuple[float, float]            # the winner's min-max tokens/s over its measurements
    mean: float                          # the winner's mean tokens/s
    measurements: dict[int, list[float]]  # every candidate's values (first: the search's)
    ties: list[int]                      # candidates the repeats cannot tell from the leader
    equivalent: list[int]                # ties within EQUIVALENT of the leader's mean
    out: dict[int, str]                  # candidates ruled out, and why
    noise: NoiseFloor
    rounds: int
    reason: str                          # one line for the person at the keyboard
    #: Whether the winner met the target on every measurement. False: no candidate did and
    #: ``winner`` is the one that came closest (:func:`no_holder`): nothing is recommended.
    held: bool = True
    worst_p95_s: float | None = None     # the winner's worst P95 TTFT over its measurements
    target_s: float | None = None

    @property
    def margin(self) -> float | None:
        """The SLO margin: 1 - worst P95 / target (0.08: the worst measurement 8 % under)."""
        if self.worst_p95_s is None or not self.target_s:
            return None
        return 1.0 - self.worst_p95_s / self.target_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "winner": self.winner, "leader": self.leader, "band": list(self.band), "mean": self.mean,
            "measurements": {str(k): v for k, v in self.measurements.items()},
            "ties": self.ties, "equivalent": self.equivalent, "out": {str(k): v for k, v in self.out.items()},
            "noise": self.noise.to_dict(), "rounds": self.rounds, "reason": self.reason,
            "held": self.held, "worst_p95_s": self.worst_p95_s, "target_s": self.target_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Confirmation:
        noise = data.get("noise") or {}
        return cls(
            winner=int(data["winner"]), leader=int(data["leader"]), band=tuple(data["band"]),  # type: ignore[arg-type]
            mean=float(data["mean"]), measurements={int(k): list(v) for k, v in data["measurements"].items()},
            ties=[int(x) for x in data["ties"]], equivalent=[int(x) for x in data["equivalent"]],
            out={int(k): str(v) for k, v in (data.get("out") or {}).items()},
            noise=NoiseFloor(float(noise.get("rel_sd", DEFAULT_PRIOR_SD)), int(noise.get("dof", 0)),
                             str(noise.get("source", "prior"))),
            rounds=int(data.get("rounds", 0)), reason=str(data.get("reason", "")),
            held=bool(data.get("held", True)),
            worst_p95_s=None if data.get("worst_p95_s") is None else float(data["worst_p95_s"]),
            target_s=None if data.get("target_s") is None else float(data["target_s"]),
        )


def _spread(lo: float, hi: float, objective: str = "tokens") -> str:
    """``26,800-27,300`` (tokens/s) or ``37.10-37.90`` (goodput): a min-max without the unit."""
    return "-".join(value_text(v, objective).split(" ")[0] for v in (lo, hi))


def confirmation_rows(mean: float, count: int, band: Sequence[float], ties: Sequence[int],
                      noise_sd: float, objective: str = "tokens") -> list[tuple[str, str]]:
    """The decision as two rows of a table (the CLI's and the report's): the winner's mean
    over its ``count`` measurements with their min-max (in the ``objective``'s unit,
    :func:`tuner.serving.slo.value_text`), and the trials tied with it with the noise that ties them."""
    lo, hi = band
    tied = ", ".join(f"#{n}" for n in ties) or "none"
    return [("confirmed", f"{value_text(mean, objective)} mean of {count} ({_spread(lo, hi, objective)})"),
            ("tied with", f"{tied} (noise sd {noise_sd:.1%})")]


def _leader(field_: Sequence[Candidate]) -> Candidate:
    """The best mean; on equal means, the trial measured first."""
    return max(field_, key=lambda c: (c.mean, -c.number))


def margin_text(worst: float | None, count: int, target: float | None) -> str:
    """``worst P95 TTFT 4.62 s of 3 measurements vs the 5 s target (8 % under)``, or ''
    (``... (3 % over)`` where a miss within a start's noise stayed in the race)."""
    if worst is None or not target:
        return ""
    side = "under" if worst <= target else "over"
    return (f"worst P95 TTFT {worst:.3g} s of {count} measurement{'s' * (count != 1)} vs the {target:g} s target "
            f"({abs(1 - worst / target):.0%} {side})")


def no_holder(field_: Sequence[Candidate], noise: NoiseFloor, *, rounds: int, target: float | None = None,
              out: dict[int, str] | None = None) -> Confirmation:
    """The race's result when every candidate missed the target on some measurement:
    nothing held (``held`` False); ``winner`` is the one that came closest (the most
    measurements that met the target, then the lowest worst P95)."""
    def misses(c: Candidate) -> int:
        return sum(1 for v in c.values if v <= 0)

    closest = min(field_, key=lambda c: (misses(c) / max(len(c.values), 1), max(c.p95s, default=math.inf), c.number))
    n, worst = len(closest.values), max(closest.p95s, default=None)
    reason = (f"no candidate met the target on every measurement; closest: trial {closest.number}, met it on "
              f"{n - misses(closest)} of {n}" + (f" (worst P95 TTFT {worst:.3g} s vs the {target:g} s target)"
                                                 if worst is not None and target else ""))
    return Confirmation(
        winner=closest.number, leader=closest.number, band=closest.band, mean=closest.mean,
        measurements={c.number: list(c.values) for c in field_}, ties=[], equivalent=[],
        out=dict(out or {}), noise=noise, rounds=rounds, reason=reason, held=False, worst_p95_s=worst, target_s=target)


def decide(race_: Sequence[Candidate], noise: NoiseFloor, *, rounds: int = 0,
           out: dict[int, str] | None = None, target: float | None = None, objective: str = "tokens") -> Confirmation:
    """The recommendation from the candidates' measurements (see the module docstring);
    its reason tells values in the ``objective``'s unit (:data:`tuner.serving.slo.OBJECTIVES`)."""
    alive = [c for c in race_ if c.mean > 0]
    if not alive:
        raise ValueError("no candidate has a measurement")
    ruled_out = dict(out or {})
    # a candidate ruled out in the race has fewer measurements, on other samples: its mean
    # is not comparable with those still in, so it cannot lead
    leader = _leader([c for c in alive if c.number not in ruled_out] or alive)
    ties = []
    for c in alive:
        if c is leader or c.number in ruled_out:
            continue
        gap = (leader.mean - c.mean) / leader.mean
        if gap <= noise.band(leader.count, c.count):
            ties.append(c)
        else:
            ruled_out[c.number] = (f"{gap:.1%} under trial {leader.number}'s mean, beyond the noise band "
                                   f"({noise.band(leader.count, c.count):.1%})")
    equivalent = [c for c in ties if (leader.mean - c.mean) / leader.mean <= EQUIVALENT and headroom_tie(c, leader)]
    pool = [leader, *equivalent]
    tight = any(c.kv_full for c in pool)  # a memory-tight card: more KV memory is the headroom (tuner.study.headroom)
    winner = min(pool, key=lambda c: (headroom_key(c.config, tight), -c.mean, c.number))
    n = winner.count
    lo, hi = winner.band
    if winner is leader:
        reason = (f"trial {winner.number}: {value_text(winner.mean, objective)}, mean of {n} "
                  f"measurement{'s' * (n != 1)} ({_spread(lo, hi, objective)})")
    else:
        reason = (f"trial {winner.number}: {value_text(winner.mean, objective)} over {n} measurements "
                  f"({_spread(lo, hi, objective)}), "
                  f"tied with trial {leader.number} ({(leader.mean - winner.mean) / leader.mean:.1%} under, within "
                  f"{EQUIVALENT:.1%}) and preferred for headroom: {_why_headroom(winner.config, leader.config, tight)}")
    tied_numbers = sorted({leader.number, *(c.number for c in ties)} - {winner.number})
    if tied_numbers:
        counts = [c.count for c in (leader, *ties)]  # what the race could tell (equivalent ones are ties)
        low, high = min(counts), max(counts)
        reason += (f"; statistically tied with trial{'s' * (len(tied_numbers) > 1)} "
                   f"{', '.join(map(str, tied_numbers))} (noise sd {noise.rel_sd:.1%}; {low}{f'-{high}' * (high > low)} measurements each "  # noqa: E501
                   f"tell gaps over {noise.band(low, high):.1%})")
    worst = max(winner.p95s, default=None)
    if margin := margin_text(worst, len(winner.p95s), target):
        reason += f"; SLO margin: {margin}"
    if missed := len(winner.values) - winner.count:
        reason += (f"; met the target on {winner.count} of {len(winner.values)} measurements (the miss"
                   f"{'es' * (missed > 1)} within a start's noise of the target)")
    return Confirmation(
        winner=winner.number, leader=leader.number, band=(lo, hi), mean=winner.mean,
        measurements={c.number: list(c.values) for c in race_},
        ties=tied_numbers, equivalent=sorted(c.number for c in pool if c is not winner),
        out=ruled_out, noise=noise, rounds=rounds, reason=reason, worst_p95_s=worst, target_s=target,
    )


def undecided(alive: Sequence[Candidate], noise: NoiseFloor | None = None) -> bool:
    """Whether more repeats could change the recommendation: a candidate still in the
    race differs from the leader in a knob that changes speed (not only in headroom,
    :func:`headroom_tie`), and (given the race's ``noise``) the band between them is
    still wider than :data:`SETTLED`."""
    if len(alive) < 2:
        return False
    leader = _leader(alive)
    return any(not headroom_tie(c, leader)
               and (noise is None or noise.band(leader.count, c.count) > SETTLED)
               for c in alive if c is not leader)


def race(entrants: Sequence[Candidate], measure: Callable[[Candidate, int], float], noise: NoiseFloor, *,
         rounds: int, max_rounds: int | None = None, simulated: bool = False, history: Iterable[Sequence[float]] = (),
         on_round: Callable[[int, list[Candidate]], None] | None = None, target: float | None = None,
         objective: str = "tokens", feasibility_min: float = FEASIBILITY, prior: float | None = None,
         ttft_noise: float | None = None) -> Confirmation:
    """Race ``entrants`` for up to ``rounds`` rounds: round ``r`` (1-based) measures each
    candidate still in with ``measure(candidate, r)`` (0 for a measurement that failed the
    target or did not start); after each, the noise floor is re-estimated from
    ``history`` (other repeated configurations of the study) and the race's own values,
    and candidates beyond the band of the leader's mean are out. Stops early when one is
    left; goes on past ``rounds``, up to ``max_rounds``, while the race is
    :func:`undecided`. A candidate whose first measurement already missed the target is
    out before the race; when every candidate is out for a miss, the result is
    :func:`no_holder`'s. An exception from ``measure`` (an interrupt, an environment fault) propagates:
    nothing is decided on a partial round. After each round, the rules of
    :func:`tuner.study.misses.verdict` put out a candidate for the target: a miss whose P95s
    (``measure`` appends one per measurement to ``c.p95s``) say with confidence, against the
    per-start TTFT noise ``ttft_noise`` (the backend's prior when None), that it misses; and
    one that met it only at one user per replica below ``feasibility_min``."""
    field_ = [Candidate(c.number, dict(c.config), list(c.values), c.capped, list(c.p95s), list(c.floor_p95s),
                        c.kv_full) for c in entrants]
    history = [list(h) for h in history]
    out: dict[int, str] = {c.number: "failed the target on an earlier measurement"
                           for c in field_ if any(v <= 0 for v in c.values)}
    done = 0
    for r in range(1, max(rounds, max_rounds or 0) + 1):
        alive = [c for c in field_ if c.number not in out]
        if not alive or (len(alive) == 1 and len(field_) > 1 and r > rounds):
            break  # decided: the others are out (the last one in is measured the set rounds, for its margin)
        if r > rounds and not undecided(alive, noise):
            break
        known = {c.number: len(c.p95s) for c in alive}
        for c in alive:
            c.values.append(float(measure(c, r)))
        done = r
        for c in alive:
            why = verdict(c, r, new_p95=len(c.p95s) > known[c.number], target=target, simulated=simulated,
                          sd=ttft_sd(simulated) if ttft_noise is None else ttft_noise, feasibility_min=feasibility_min)
            if why is not None:
                out[c.number] = why
        alive = [c for c in alive if c.number not in out]
        # candidates still in were measured on the same samples: compare them paired
        noise = (paired_noise([c.values for c in alive], simulated, prior) if len(alive) >= 2
                 else noise_floor([*history, *(c.values for c in field_)], simulated, prior))
        if alive:
            leader = _leader(alive)
            for c in alive:
                if c is not leader and (leader.mean - c.mean) / leader.mean > noise.band(leader.count, c.count):
                    out[c.number] = (f"{(leader.mean - c.mean) / leader.mean:.1%} under trial {leader.number}'s mean "
                                     f"after {r} repeat{'s' * (r > 1)}, beyond the noise band")
        if on_round is not None:
            on_round(r, [c for c in field_ if c.number not in out])
    alive = [c for c in field_ if c.number not in out]
    if not alive:  # every candidate failed a repeat: nothing held the target
        return no_holder(field_, noise, rounds=done, target=target, out=out)
    return decide(alive + [c for c in field_ if c.number in out], noise, rounds=done, out=out, target=target,
                  objective=objective)


__all__ = ["HEADROOM_KNOBS", "feasibility", "ttft_sd", "upper_p95", "SETTLED", "Candidate", "Confirmation", "NoiseFloor", "candidates", "confirmation_rows", "decide",  # noqa: E501
           "headroom_key", "headroom_tie", "margin_text", "no_holder", "noise_floor", "paired_noise", "prior_sd", "race",  # noqa: E501
           "undecided"]

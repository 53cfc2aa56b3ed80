"""Whether a race candidate's measurements put it out for the target (:func:`verdict`),
apart from its tokens/s: the race's feasibility rules (:mod:`tuner.study.race`, item 5).

* A measurement that missed with no P95 to weigh (the server did not start, or errors
  failed the load) is out: that is not a start's noise.
* A miss with a P95 is weighed against the per-start TTFT noise: out only once the
  candidate's P95s say with confidence that it misses
  (:func:`~tuner.study.noise.misses_with_confidence`). On real vLLM a start's TTFTs share a
  factor of ~10 %: a configuration whose P95 sits a few percent under the target misses on
  about one start in three, and one miss of six (issue 49) said nothing the five passes did not.
* A candidate that met the target only at one user per replica (``floor_p95s``: no lower
  load exists to fall back to) stays in only while the probability that its true P95
  there meets the target is above ``feasibility_min`` (``--feasibility``).

Pure: no study, no backend.
"""
from __future__ import annotations

from typing import Any

from tuner.study.noise import feasibility, misses_with_confidence


def verdict(c: Any, r: int, *, new_p95: bool, target: float | None, sd: float, simulated: bool,
            feasibility_min: float) -> str | None:
    """Why candidate ``c`` (a :class:`~tuner.study.race.Candidate`) is out after repeat ``r``,
    or None: ``new_p95`` says whether the repeat added a P95 to ``c.p95s``; ``sd`` is the
    per-start TTFT noise the misses are weighed against."""
    repeats = f"{r} repeat{'s' * (r > 1)}"
    if c.values[-1] <= 0:
        if not (target and new_p95):
            return f"failed the target or did not start on repeat {r}"
        if misses_with_confidence(c.p95s, target, sd):
            return (f"failed the target on repeat {r} (P95 TTFT {c.p95s[-1]:.3g} s against {target:g} s): its P95s "
                    f"over {repeats} miss it beyond a start's noise (sd {sd:.0%})")
    if target and c.floor_p95s and (p := feasibility(c.floor_p95s, target, simulated)) <= feasibility_min:
        return (f"feasibility {p:.0%} after {repeats}, not above {feasibility_min:.0%}: "
                f"P95 TTFT up to {max(c.floor_p95s):.3g} s at one user per replica, within a "
                f"start's noise of the {target:g} s target")
    return None


__all__ = ["verdict"]

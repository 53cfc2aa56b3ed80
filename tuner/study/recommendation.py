"""The study's recommendation (:class:`Recommendation`): its winner, measurement and confirmation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.study.companion import confirmation
from tuner.study.trials import best_feasible_trial

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, slots=True)
class Recommendation:
    """What a study recommends, as every reader tells it (``tuner search`` and ``tuner studies
    show``, the report, the notebook, :func:`tuner.study.analysis.recommendation`): the trial
    (:func:`best_feasible_trial`), what that trial measured, and the confirmation that chose it
    (None when none did: ``--confirm 0``, or trials finished after it)."""

    trial: int
    value: float                 #: the trial's own measurement (the objective's unit)
    confirmation: Any = None     #: tuner.study.race.Confirmation whose winner is ``trial``

    @property
    def confirmed(self) -> bool:
        return self.confirmation is not None

    @property
    def mean(self) -> float:
        """The figure to plan with: the confirmed mean over the repeats, else the one measurement."""
        return float(self.confirmation.mean) if self.confirmed else self.value

    @property
    def measurements(self) -> int:
        return len(self.confirmation.measurements.get(self.trial, [])) if self.confirmed else 1

    def to_dict(self) -> dict[str, Any]:
        conf = self.confirmation
        return {"trial": self.trial, "value": self.value, "mean": self.mean, "measurements": self.measurements,
                "band": None if conf is None else list(conf.band), "reason": None if conf is None else conf.reason}


def recommendation(study: optuna.Study) -> Recommendation | None:
    """The study's :class:`Recommendation`, or None when it recommends nothing (no trial met the
    target, or none held it on every repeat)."""
    best = best_feasible_trial(study)
    if best is None:
        return None
    conf = confirmation(study)
    return Recommendation(best.number, float(best.value or 0.0),
                          conf if conf is not None and conf.winner == best.number else None)

"""What a run of a study left (:class:`SearchOutcome`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.serving.config import Deployment
from tuner.serving.slo import SloSet

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


@dataclass(slots=True)
class SearchOutcome:
    """What a run of a study left: the study, its recommendation (``best``, None when no
    configuration met the target) and what this run did."""

    study: optuna.Study
    name: str
    storage: str | None
    best: FrozenTrial | None
    finished: int
    new_trials: int
    wall_s: float
    gpu_s: float  # startup + replay seconds of this session's trials
    notes: list[str] = field(default_factory=list)
    timed_out: bool = False
    confirmation: Any = None  # tuner.study.race.Confirmation of the study's winner, when made
    deployment: Deployment | None = None
    target_ttft_s: float | None = None
    backend: str | None = None  # the backend's name
    slos: tuple[str, ...] = ()  # every SLO the study met (``p95:ttft<=2s`` first)
    copies: int = 0  # of ``new_trials``: configurations measured before, re-read (free up to FREE_COPIES)

    def slo_text(self) -> str:
        """``P95 TTFT <= 2 s`` (and the other SLOs of the study)."""

        if len(self.slos) > 1:
            return SloSet.of(self.slos).describe()
        return f"P95 TTFT <= {self.target_ttft_s:g} s"

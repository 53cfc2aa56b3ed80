"""How a study measures (:class:`SearchSettings`), and the defaults it starts from."""
from __future__ import annotations

from dataclasses import dataclass

from tuner.core.errors import InputError
from tuner.search.goodput import EDGE_TOLERANCE, MAX_REPLAYS
from tuner.serving.slo import OBJECTIVES
from tuner.study.race import FEASIBILITY

#: The largest seed (numpy's generators take 0 to 2**32 - 1).
MAX_SEED = 2**32 - 1
#: Repeat measurements per candidate when confirming a study's winner (``--confirm``).
CONFIRM_ROUNDS = 2
#: Rounds a race may go on to while a candidate that differs from the leader in a speed
#: knob is still tied with it (``--confirm-max``).
CONFIRM_MAX_ROUNDS = 5


def check_seed(seed: object) -> int:
    """``seed`` when it is a whole number numpy's generators take, else one line of bad input."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InputError(f"seed must be a whole number from 0 to {MAX_SEED:,}, got {seed!r}", hint="e.g. 0",
                         argument="seed")
    return seed


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """How a study measures: handed whole from :func:`tuner.search` to the run, each trial's
    evaluation (:class:`~tuner.search.context.TrialContext`) and the confirmation race.

    ``budget`` finished trials (a resumed study is topped up to it), ``timeout_s`` of wall
    time for this run (``None``: no limit), the Optuna ``sampler`` and ``seed``;
    ``precheck`` (the simulator's memory planner before a start), ``early_stop`` (a replay
    that can no longer meet the target stops), ``max_replays`` per trial; ``confirm`` repeats
    of the configurations tied with the best (up to ``confirm_max`` while a speed knob is
    still tied), ``edge_tolerance`` (how close a passing and a failing load must come),
    ``kill_stale`` (kept for old scripts), ``feasibility`` (a race candidate near the target
    stays in only above this probability), ``objective`` (``tokens``: tokens/s; ``goodput``:
    requests/s meeting every SLO), ``resume_anyway`` (resume a study whose space was another),
    ``start_refused`` (start what the memory planner predicts vLLM refuses,
    :mod:`tuner.search.refusal`)."""

    budget: int = 40
    timeout_s: float | None = None
    sampler: str = "tpe"
    seed: int = 0
    precheck: bool = True
    early_stop: bool = True
    max_replays: int = MAX_REPLAYS
    confirm: int = CONFIRM_ROUNDS
    confirm_max: int = CONFIRM_MAX_ROUNDS
    edge_tolerance: float = EDGE_TOLERANCE
    kill_stale: bool = False
    feasibility: float = FEASIBILITY
    objective: str = "tokens"
    resume_anyway: bool = False
    start_refused: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1:
            raise InputError(f"budget must be >= 1, got {self.budget!r}", argument="budget")
        check_seed(self.seed)
        if not 0 < self.feasibility < 1:
            raise InputError(f"feasibility must be a probability in (0, 1), got {self.feasibility:g}",
                             hint="e.g. 0.9", argument="feasibility")
        if self.objective not in OBJECTIVES:
            raise InputError(f"objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}",
                             argument="objective")


__all__ = ["CONFIRM_MAX_ROUNDS", "CONFIRM_ROUNDS", "MAX_SEED", "SearchSettings", "check_seed"]

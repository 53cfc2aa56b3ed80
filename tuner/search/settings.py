"""How a study measures (:class:`SearchSettings`)."""
from __future__ import annotations

from dataclasses import dataclass

from tuner.core.errors import InputError
from tuner.search.confirm import CONFIRM_MAX_ROUNDS, CONFIRM_ROUNDS
from tuner.search.goodput import EDGE_TOLERANCE, MAX_REPLAYS
from tuner.search.objective import OBJECTIVES
from tuner.study.race import FEASIBILITY


#: The largest seed (numpy's generators take 0 to 2**32 - 1).
MAX_SEED = 2**32 - 1


def check_seed(seed: object) -> int:
    """``seed`` when it is a whole number numpy's generators take, else one line of bad input."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InputError(f"--seed must be a whole number from 0 to {MAX_SEED:,}, got {seed!r}", hint="e.g. --seed 0")
    return seed


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """How a study measures (the knobs of :func:`run_search` that are not its inputs)."""

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
    feasibility: float = FEASIBILITY  #: a race candidate near the target stays in only above this probability
    objective: str = "tokens"  #: a trial's value: ``tokens`` (tokens/s) or ``goodput`` (requests/s meeting every SLO)
    resume_anyway: bool = False  #: resume a study whose space was another (:meth:`SearchRun._check_space`)
    start_refused: bool = False  #: start what the memory planner predicts vLLM refuses (:mod:`tuner.search.refusal`)

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise InputError(f"--budget must be >= 1, got {self.budget}")
        check_seed(self.seed)
        if not 0 < self.feasibility < 1:
            raise InputError(f"--feasibility must be a probability in (0, 1), got {self.feasibility:g}",
                             hint="e.g. --feasibility 0.9")
        if self.objective not in OBJECTIVES:
            raise InputError(f"--objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")

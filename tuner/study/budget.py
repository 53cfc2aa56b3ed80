"""Which trials count against ``--budget``: the finished ones, but copies past the free ones and
never a confirmation's repeats."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.study.record import TrialRecord
from tuner.study.recovery import not_measured

if TYPE_CHECKING:
    import optuna


def finished_states() -> tuple[Any, ...]:
    from optuna.trial import TrialState

    return (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


#: Copies (a configuration the study measured before, proposed again: recorded from that
#: measurement, no server started) take no slot of ``--budget``, up to this many per study;
#: past it each does, so the loop ends even on a space with fewer configurations than the budget.
FREE_COPIES = 40


def count_finished(study: optuna.Study) -> int:
    """Trials that count against ``--budget``: finished, except failures that measured
    nothing (interrupted, environment faults: :mod:`tuner.study.recovery`) and, up to
    :data:`FREE_COPIES`, copies of a configuration measured before."""
    trials = study.get_trials(deepcopy=False, states=finished_states())
    counted = [t for t in trials if counts_toward_budget(t)]
    return len(counted) - free_copies(sum(1 for t in counted if is_copy(t)))


def counts_toward_budget(trial: Any) -> bool:
    """Whether one finished trial is counted by :func:`count_finished` before the copies
    it lets go free (:func:`free_copies`)."""

    return not not_measured(trial) and not is_confirmation(trial)


def is_copy(trial: Any) -> bool:
    """A trial that measured nothing new: the sampler proposed a configuration the study
    measured before, and the trial holds that measurement (``repeat_of``)."""
    rec = TrialRecord.from_trial(trial)
    return rec.is_repeat and not rec.is_confirmation


def free_copies(copies: int) -> int:
    """How many of a study's ``copies`` take no budget slot."""
    return min(copies, FREE_COPIES)


def copy_slots(study: optuna.Study) -> int:
    """Budget slots the study's copies took (0 until it has more than :data:`FREE_COPIES`)."""
    trials = study.get_trials(deepcopy=False, states=finished_states())
    copies = sum(1 for t in trials if counts_toward_budget(t) and is_copy(t))
    return copies - free_copies(copies)


def is_confirmation(trial: Any) -> bool:
    """A repeat measurement of an earlier trial's configuration made to confirm the
    study's winner (:mod:`tuner.study.race`): not sampled, not counted in the budget."""
    return TrialRecord.from_trial(trial).is_confirmation

"""The time window of a run (``--timeout``): how long a trial of this study takes, so that
none is started that the window cannot hold (its GPU time would be thrown away).

The estimate is the study's own: the longest finished trial that started a server (its
start, goodput search and stop; copies of a measurement and pre-check refusals took no
server). Before any trial did, there is nothing to go by and the trial starts (a cut one is
measured again when the study resumes).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.search.blame import started
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    import optuna


def trial_estimate(study: optuna.Study) -> float | None:
    """Wall seconds the study's longest finished trial that started a server took (its
    start, goodput search and stop); None before any did."""
    from optuna.trial import TrialState

    took = [t.duration.total_seconds() for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.duration is not None and started(TrialRecord.from_trial(t))
            and TrialRecord.from_trial(t).repeat_of is None]
    return max(took) if took else None


__all__ = ["trial_estimate"]

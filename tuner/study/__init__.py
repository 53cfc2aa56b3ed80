"""Studies are Optuna's: this package names them, finds their storage, keeps their records,
and reads the trials the search wrote (see ``tuner.search`` for what each trial stores).

Storage defaults to ``sqlite:///studies/<name>.db`` (one file per study, relative to the
working directory); any SQLAlchemy URL works (``postgresql://...`` lets several
``tuner search`` workers share one study). Every trial keeps its results in
``trial.user_attrs``, read through :class:`tuner.study.record.TrialRecord`: ``feasible`` says
whether the configuration met the TTFT target and ``constraint`` repeats Optuna's
constraint value (<= 0 feasible).

Budget: ``--budget N`` counts the study's *finished* trials, whatever their state
(COMPLETE, PRUNED, FAIL); infeasible configurations are COMPLETE trials with a
violated constraint. Trials left RUNNING by a killed process are not counted.
On a server database (``postgresql://``) several workers share the budget, and trials
running on other workers count too; see :mod:`tuner.study.workers`.

The package, one module per noun: ``naming`` (:func:`study_name`, companions' names),
``budget`` (which trials count against ``--budget``), ``companion`` (:func:`confirmation_study`,
:func:`repeats`, :func:`confirmation`), ``opening`` (:func:`open_study`, :func:`load_study_by_name`,
:func:`delete_study`, :func:`list_studies`), ``trials`` (the best, the feasible, the closest miss,
errors, GPU time, :func:`trial_config`) and ``recommendation`` (:class:`Recommendation`). Every
public name of these is imported here.

The study's records and where it lives, each imported by its own path: ``record``
(:class:`~tuner.study.record.TrialRecord`, :class:`~tuner.study.record.StudyRecord`), ``race``
(the confirmation race) and ``noise`` (run-to-run noise), ``effective`` (knobs without effect),
``storage`` and ``locks`` (the storage handle, named locks), ``recovery`` (trials that measured
nothing), ``workers`` (several workers on one study) and ``analysis`` (a study as tables, typed by ``tables``).
"""
from __future__ import annotations

from tuner.study.budget import (
    FREE_COPIES,
    copy_slots,
    count_finished,
    counts_toward_budget,
    finished_states,
    free_copies,
    is_confirmation,
    is_copy,
)
from tuner.study.companion import confirmation, confirmation_study, repeats, storage_handle
from tuner.study.naming import COMPANION_SUFFIX, METRIC_NAMES, companion_name, name_objective, own_studies, study_name
from tuner.study.opening import StudySummary, delete_study, list_studies, load_study_by_name, open_study, summarize
from tuner.study.recommendation import Recommendation, recommendation
from tuner.study.trials import (
    best_feasible_trial,
    closest_miss,
    error_totals,
    gpu_time,
    is_feasible,
    miss_explanation,
    top_feasible_trials,
    trial_config,
)

__all__ = [
    "FREE_COPIES",
    "copy_slots",
    "count_finished",
    "counts_toward_budget",
    "finished_states",
    "free_copies",
    "is_confirmation",
    "is_copy",
    "confirmation",
    "confirmation_study",
    "repeats",
    "storage_handle",
    "COMPANION_SUFFIX",
    "METRIC_NAMES",
    "companion_name",
    "name_objective",
    "own_studies",
    "study_name",
    "StudySummary",
    "delete_study",
    "list_studies",
    "load_study_by_name",
    "open_study",
    "summarize",
    "Recommendation",
    "recommendation",
    "best_feasible_trial",
    "closest_miss",
    "error_totals",
    "gpu_time",
    "is_feasible",
    "miss_explanation",
    "top_feasible_trials",
    "trial_config",
]

"""A trial's Optuna constraints, written where both Optuna and optuna-dashboard read them."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tuner.study.storage import trial_id

if TYPE_CHECKING:
    import optuna

#: The trial system attr holding its constraint values as a list (<= 0 feasible): what Optuna's
#: ``constraints_func`` wrote. Optuna 5 reads it as constraints ``"0"``, ``"1"``, ... beside the
#: ``constraints:<name>`` attrs of ``trial.set_constraint``; optuna-dashboard (0.21) reads only
#: it, to grey out infeasible trials. Written in one form only, so that the sampler sees each
#: constraint once; their names stay in the trial's record (``TrialRecord.constraint``/``constraints``).
CONSTRAINTS_ATTR = "constraints"


def named_constraints(study: optuna.Study) -> bool:
    """Whether the study's trials hold their constraints by name (``set_constraint``, written
    before the list): its new trials must too, for Optuna's GP sampler requires every trial
    of a study to carry the same constraint names."""
    return any(k.startswith(f"{CONSTRAINTS_ATTR}:") for t in study.get_trials(deepcopy=False) for k in t.system_attrs)


def constraint_list(constraints: Mapping[str, float]) -> list[float]:
    """The values of :data:`CONSTRAINTS_ATTR`: the constraints in name order."""
    return [float(constraints[name]) for name in sorted(constraints)]


def tell_constraints(trial: optuna.Trial, constraints: Mapping[str, float], *, named: bool = False) -> None:
    """Give the running ``trial`` its constraint values, in name order; by name
    (``trial.set_constraint``) in a study that holds them so (:func:`named_constraints`)."""
    values = constraint_list(constraints)
    if any(math.isnan(v) for v in values):
        raise ValueError(f"trial {trial.number}: a constraint is NaN ({dict(constraints)})")
    if named:
        for name in sorted(constraints):
            trial.set_constraint(name, float(constraints[name]))
        return
    storage = trial.storage
    storage.set_trial_system_attr(trial_id(storage, trial.study, trial.number), CONSTRAINTS_ATTR, values)

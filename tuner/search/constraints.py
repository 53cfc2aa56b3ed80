"""A trial's Optuna constraints: what the sampler is told of a trial, read from its record
(:func:`told`), and the public paths by which Optuna gets it.

* TPE and GP get a ``constraints_func`` (:func:`sampler_constraints`): Optuna calls it after
  each trial and writes the values itself as the trial's ``constraints`` list, which its
  samplers read and optuna-dashboard (0.21) greys infeasible trials by. (Optuna 5 marks
  ``constraints_func`` for removal in 7.0 in favour of ``Trial.set_constraint``; the
  dashboard pinned here reads only the list, so the list stays until it reads names.)
* A sampler without ``constraints_func`` (random, grid), and a study whose trials hold their
  constraints by name (written by tuner 0.1.0; Optuna's GP sampler needs one set of names per
  study), are told by name during the trial: ``Trial.set_constraint`` (:func:`tell_by_name`).

Each trial carries its constraints in one form only, so a sampler sees each constraint once;
their names stay in the trial's record (``TrialRecord.constraint``/``constraints``)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

#: Name of the trial constraint: P95 TTFT / target - 1 (<= 0 feasible; 1.0 for refusals).
#: Every SLO of a set is a constraint of its own, named :attr:`tuner.serving.slo.Slo.constraint`.
CONSTRAINT = "p95_ttft_over_target"
#: Optuna's trial system attr of the constraints as a list (the form its ``constraints_func``
#: writes), and the prefix of those set by name (``constraints:<name>``).
CONSTRAINTS_ATTR = "constraints"
#: Samplers that take a ``constraints_func``.
LIST_SAMPLERS = ("tpe", "gp")


def told(rec: TrialRecord) -> dict[str, float]:
    """What the sampler is told of a trial, by constraint name, from its record: one
    constraint per SLO (:data:`CONSTRAINT` alone for a P95 TTFT target), with P95 TTFT as a
    verdict of two starts weighed it (``verdict``, :mod:`tuner.search.verdict`) or as a pass
    within a start's noise of the target was told (``boundary``, :mod:`tuner.search.boundary`);
    1.0 (not feasible) for a trial that recorded none."""
    out = dict(rec.constraints or {CONSTRAINT: rec.constraint if rec.constraint is not None else 1.0})
    if rec.verdict:
        out[CONSTRAINT] = float(rec.verdict["constraint"])
    if rec.boundary:
        out[CONSTRAINT] = float(rec.boundary["sampler_constraint"])
    return {name: float(value) for name, value in out.items()}


def constraint_list(constraints: Mapping[str, float]) -> list[float]:
    """The constraints as Optuna's list holds them: in name order."""
    return [float(constraints[name]) for name in sorted(constraints)]


def sampler_constraints(trial: FrozenTrial) -> list[float]:
    """The ``constraints_func`` of TPE and GP: the finished ``trial``'s :func:`told`, as a list."""
    return constraint_list(told(TrialRecord.from_trial(trial)))


def named_constraints(study: optuna.Study) -> bool:
    """Whether the study's trials hold their constraints by name (``set_constraint``, written
    by tuner 0.1.0): its new trials must too, for Optuna's GP sampler requires every trial
    of a study to carry the same constraint names."""
    return any(k.startswith(f"{CONSTRAINTS_ATTR}:") for t in study.get_trials(deepcopy=False) for k in t.system_attrs)


def tell_by_name(trial: optuna.Trial, constraints: Mapping[str, float]) -> None:
    """Give the running ``trial`` its constraint values by name, in name order
    (``Trial.set_constraint``, Optuna's documented API)."""
    if any(math.isnan(v) for v in constraints.values()):
        raise ValueError(f"trial {trial.number}: a constraint is NaN ({dict(constraints)})")
    for name in sorted(constraints):
        trial.set_constraint(name, float(constraints[name]))


__all__ = ["CONSTRAINT", "CONSTRAINTS_ATTR", "LIST_SAMPLERS", "constraint_list", "named_constraints",
           "sampler_constraints", "tell_by_name", "told"]

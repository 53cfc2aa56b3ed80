"""A study's companion (``<name>.confirm``): the study, in the same storage, that holds the
repeats confirming its winner, and the confirmation the study keeps (:func:`confirmation`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.study.budget import count_finished, is_confirmation
from tuner.study.naming import companion_name, name_objective
from tuner.study.race import Confirmation
from tuner.study.record import StudyRecord, write_confirmation
from tuner.study.storage import opened, storage_of

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


def storage_handle(study: optuna.Study, storage: Any = None) -> Any:
    """The storage ``study`` was opened on; its companion is opened on the same one (the same
    database, connection and cache: also a read-only file, or a server shared by workers).

    A study tuner opened (``tuner.open_study``, :func:`tuner.study.analysis.open_study`) has it
    kept; one opened with optuna itself has no public handle to it, so the caller passes
    ``storage``: the URL, or the optuna storage it opened the study with."""
    if storage is not None and not isinstance(storage, str):
        opened(study, storage)
        return storage
    handle = storage_of(study, storage)
    if handle is None:
        raise InputError(f"study {study.study_name!r} was opened with optuna itself, which tells tuner no storage",
                         hint="pass storage= (its URL or optuna storage), or open it with tuner.open_study")
    return handle


def confirmation_study(study: optuna.Study, *, create: bool = False, storage: Any = None) -> optuna.Study | None:
    """The companion study holding ``study``'s confirmation repeats (:data:`COMPANION_SUFFIX`),
    or None when it has none. ``create``: make it when missing and link it from the study
    (:attr:`~tuner.study.record.StudyRecord.confirmation_study`), as the confirmation does before its
    first repeat. ``storage``: see :func:`storage_handle`."""
    import optuna

    linked = StudyRecord.from_study(study).confirmation_study
    if linked is None and not create:
        return None
    name = linked or companion_name(study.study_name)
    if create:
        companion = optuna.create_study(study_name=name, storage=storage_handle(study, storage), direction="maximize",
                                        load_if_exists=True)
        if linked is None:
            companion.set_user_attr("confirmation_of", study.study_name)
            write_confirmation(study.set_user_attr, companion=name)
        return name_objective(companion)
    try:
        return optuna.load_study(study_name=name, storage=storage_handle(study, storage))
    except KeyError:  # linked, but removed by hand
        return None


def repeats(study: optuna.Study, storage: Any = None) -> list[FrozenTrial]:
    """The repeat measurements confirming ``study``'s winner: its companion's trials, and those
    a study written before the companion existed holds among its own (``confirm_of`` set:
    read as repeats, never as configurations). Each names its trial (``confirm_of``, a trial
    number of ``study``) and round (``confirm_round``). ``storage``: see :func:`storage_handle`."""
    legacy = [t for t in study.get_trials(deepcopy=False) if is_confirmation(t)]
    companion = confirmation_study(study, storage=storage)
    return legacy + ([] if companion is None else companion.get_trials(deepcopy=False))


def confirmation(study: optuna.Study) -> Any:
    """The study's :class:`~tuner.study.race.Confirmation`, or None when it has none or
    trials finished after it was made (it no longer covers them)."""

    data = StudyRecord.from_study(study).confirmation
    if not data or int(data.get("finished", -1)) != count_finished(study):
        return None
    try:
        return Confirmation.from_dict(data)
    except (KeyError, TypeError, ValueError):
        return None

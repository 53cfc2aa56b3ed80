"""Checks a ``--storage`` URL before a command reads studies from it, so that a typo, a
missing driver, a server that is down or refuses the credentials is one line (exit 2),
the same line ``tuner search`` gives (:func:`tuner.study.storage.storage_open_error`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.core.urls import redact
from tuner.plan import newest_study
from tuner.study.analysis import open_study
from tuner.study.locks import driver_url, sqlite_path
from tuner.study.storage import storage_open_error

if TYPE_CHECKING:
    import optuna


def readable_storage(storage: str | None) -> None:
    """Raise the one-line :class:`InputError` when ``storage`` cannot be read; ``None``
    (the studies/ folder) is always fine. A SQLite file that does not exist is named as
    such, and not created."""
    if storage is None:
        return
    import optuna

    shown = redact(storage)
    if "://" not in storage:
        raise InputError(f"--storage {shown!r} is not a storage URL",
                         hint="give an SQLAlchemy URL such as sqlite:///studies/NAME.db or postgresql://...")
    path = sqlite_path(storage)
    if path is not None and not path.is_file():
        raise InputError(f"no study database at {path}", hint="give the --storage that tuner search was given "
                         "(tuner studies lists the studies in studies/)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        optuna.get_all_study_names(driver_url(storage))
    except Exception as err:
        fault = storage_open_error(err, shown, storage)
        if fault is None:
            raise
        raise fault from err


def study_argument(study: str | None, storage: str | None, command: str) -> optuna.Study:
    """The study a reading command was pointed at (``tuner report STUDY``): a name, a
    studies/NAME.db file or a storage URL, in ``storage`` when given; the newest study
    when ``study`` is None. A missing study or storage is one line naming what to give
    ``command``."""

    readable_storage(storage)
    if study is not None and "://" in study:
        readable_storage(study)
    if study is None:
        try:
            study = newest_study(storage=storage)
        except InputError as err:
            where = "" if storage is None else " --storage URL"
            raise InputError(err.message, hint=f"run tuner search first, or name the study: tuner {command} "
                                               f"NAME{where} (tuner studies lists them)") from err
    return open_study(study, storage)


__all__ = ["readable_storage", "study_argument"]

"""Opening, loading, deleting and listing studies."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError, TunerError
from tuner.core.urls import redact
from tuner.study.budget import count_finished, counts_toward_budget, finished_states, is_copy
from tuner.study.companion import confirmation_study, storage_handle
from tuner.study.naming import name_objective, own_studies
from tuner.study.record import StudyRecord
from tuner.study.storage import (
    STUDIES_DIR,
    check_study_name,
    is_shared,
    opened,
    optuna_storage,
    storage_fault,
    storage_open_error,
)
from tuner.study.trials import best_feasible_trial, is_feasible

if TYPE_CHECKING:
    import optuna


def delete_study(name: str, storage: str | None = None) -> None:
    """Delete study ``name`` and its companion (:func:`confirmation_study`) from ``storage``."""
    import optuna

    st = load_study_by_name(name, storage)
    companion = confirmation_study(st)
    store = storage_handle(st)
    if companion is not None:
        optuna.delete_study(study_name=companion.study_name, storage=store)
    optuna.delete_study(study_name=name, storage=store)


def open_study(name: str, storage: str | None = None, *, sampler: Any = None) -> optuna.Study:
    """Create the study, or load it when it exists (resume)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_study_name(name)
    shown = redact(storage) if storage else f"sqlite:///{STUDIES_DIR / name}.db"
    store = None
    try:
        store = optuna_storage(storage, name)
        return name_objective(opened(optuna.create_study(
            study_name=name, storage=store, sampler=sampler, direction="maximize", load_if_exists=True,
        ), store))
    except (ImportError, ValueError, TypeError) as err:  # bad URL, missing driver
        raise storage_open_error(err, shown, storage) from err  # type: ignore[misc]  # never None for these
    except OSError as err:  # the studies/ folder cannot be made or written
        from tuner.core.files import write_fault

        raise write_fault(Path(err.filename or STUDIES_DIR), err) from err
    except TunerError:  # one line of its own (a study file that is empty, not SQLite, or gone)
        raise
    except Exception as err:
        # a database server never reached cannot have "gone away": it is said what happened instead
        first = storage_open_error(err, shown, storage) if store is None and is_shared(storage) else None
        fault = first or storage_fault(err, shown) or storage_open_error(err, shown, storage)
        if fault is not None:
            raise fault from err
        raise


def load_study_by_name(name: str, storage: str | None = None) -> optuna.Study:
    """An existing study; ``InputError`` listing the known ones when absent."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_study_name(name)
    if storage is None:
        path = STUDIES_DIR / f"{name}.db"
        if not STUDIES_DIR.is_dir():
            raise InputError(f"no study {name!r}: there is no {STUDIES_DIR}/ folder in {Path.cwd()}, so no study "
                             "was run from here", hint="run tuner in the folder tuner search ran in, or give --storage")
        if not path.is_file():
            from tuner.study.sqlite_file import check

            check(path)  # a study saved when its file vanished is named
            known = ", ".join(s.name for s in list_studies()) or "none"
            raise InputError(f"no study {name!r} in {STUDIES_DIR}/", hint=f"known studies: {known}")
    try:
        store = optuna_storage(storage, name)
        return opened(optuna.load_study(study_name=name, storage=store), store)
    except KeyError as err:
        known = ", ".join(own_studies(optuna.get_all_study_names(optuna_storage(storage, name)))) if storage else ""
        raise InputError(f"no study {name!r} in {storage}", hint=f"known studies: {known or 'none'}") from err


@dataclass(frozen=True, slots=True)
class StudySummary:
    name: str
    storage: str
    finished: int
    feasible: int
    best_value: float | None
    best_trial: int | None
    objective: str | None = None  #: what ``best_value`` scores (:data:`tuner.serving.slo.OBJECTIVES`)


def summarize(study: optuna.Study, storage: str) -> StudySummary:
    trials = study.get_trials(deepcopy=False, states=finished_states())
    best = best_feasible_trial(study)
    return StudySummary(
        name=study.study_name, storage=storage, finished=count_finished(study),  # as --budget counts them
        feasible=sum(1 for t in trials if is_feasible(t) and counts_toward_budget(t) and not is_copy(t)),  # of those
        best_value=None if best is None else best.value,
        best_trial=None if best is None else best.number, objective=StudyRecord.from_study(study).objective,
    )


def list_studies(storage: str | None = None) -> list[StudySummary]:
    """Every study in ``studies/*.db`` (or in ``storage``)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    urls = [storage] if storage else [f"sqlite:///{p}" for p in sorted(STUDIES_DIR.glob("*.db"))]
    out = []
    for url in urls:
        store = optuna_storage(url, "")  # the driver that is installed (tuner.study.workers.driver_url)
        for name in own_studies(optuna.get_all_study_names(store)):
            out.append(summarize(optuna.load_study(study_name=name, storage=store), url))
    return out

"""Where studies live and how they are opened, locked and guarded: the storage every
part that reads or writes a study shares (:mod:`tuner.study`, :mod:`tuner.study.workers`,
nightly runs, ``tuner doctor``).

* :func:`optuna_storage` — the Optuna storage for a URL: ``sqlite:///studies/<name>.db``
  by default (WAL mode), or a server database with Optuna's heartbeat and one retry of a
  trial whose worker died (:class:`RetryOnce`), for several workers on one study.
* :func:`opened` and :func:`storage_of` — the storage handle a study was opened with,
  which tuner keeps itself: Optuna gives a study no public one, and trial writes outside
  a live ``optuna.Trial`` (a leftover failed on resume, a twin's mark) go through it.
* :class:`~tuner.study.locks.StudyLock` (from :mod:`tuner.study.locks`) — a named lock on a study.
* :func:`storage_open_error` — a storage that cannot be opened (a bad URL, a missing
  driver, a server refusing) as one line of bad input; :func:`storage_fault` and
  :func:`guard_storage` — a database that cannot be written (a full disk, a read-only
  file, a lost server) as one line, an :class:`~tuner.core.errors.EnvironmentFault`.
"""
from __future__ import annotations

import copy
import os
import sqlite3
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import EnvironmentFault, InputError, TunerError
from tuner.core.urls import redact, unreachable
from tuner.study import sqlite_file
from tuner.study.locks import StudyLock, driver_url, sqlite_path
from tuner.study.record import TrialRecord
from tuner.study.sqlite_file import file_fault, lost

if TYPE_CHECKING:
    import optuna

STUDIES_DIR = Path("studies")

HEARTBEAT_ENV = "TUNER_HEARTBEAT_S"

DEFAULT_HEARTBEAT_S = 60

#: A running trial is stale after this many missed heartbeats.
GRACE_FACTOR = 3

#: How often a retried configuration may run again.
MAX_RETRY = 1


#: The longest study name: it names files (``studies/<name>.db``, ``-wal``, ``studies/<name>/``).
MAX_STUDY_NAME = 200


def check_study_name(name: str) -> str:
    """``name`` when it can name a study's files inside ``studies/``: letters, digits,
    ``.``, ``_`` and ``-``, not starting with ``.`` nor holding ``..``, at most
    :data:`MAX_STUDY_NAME` characters; else one line of bad input (nothing written)."""
    import re

    why = None
    if not name:
        why = "is empty"
    elif len(name) > MAX_STUDY_NAME:
        why = f"is {len(name)} characters long, more than {MAX_STUDY_NAME}"
    elif "/" in name or "\\" in name:
        why = "holds a path separator"
    elif ".." in name or name.startswith("."):
        why = "holds '..' or starts with '.'"
    elif not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        bad = sorted(set(re.sub(r"[A-Za-z0-9._-]", "", name)))
        why = f"holds {' '.join(repr(c) for c in bad)}"
    if why is not None:
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise InputError(f"study name {shown!r} {why}: it names files under {STUDIES_DIR}/",
                         hint="use letters, digits, '.', '_' and '-', at most 200 characters")
    return name


# -- URLs and storages ----------------------------------------------------------------
def default_storage(name: str, folder: Path | str = STUDIES_DIR) -> str:
    """``sqlite:///studies/<name>.db``; creates the folder."""
    check_study_name(name)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / name}.db"


class _WalSqlite(sqlite3.Connection):
    """SQLite connection in WAL mode with ``synchronous=NORMAL``: a commit no longer
    waits for an fsync (18 ms each on this machine's disk, ~15 per trial), and a crash of
    the process still loses nothing committed (only a power cut can drop the last few
    transactions; https://www.sqlite.org/wal.html). Readers and other writers still work."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute("PRAGMA journal_mode=WAL")
        self.execute("PRAGMA synchronous=NORMAL")


def optuna_storage(storage: str | None, name: str) -> Any:
    """An Optuna storage for the URL (the default SQLite file when ``None``)."""
    import optuna

    url = storage or default_storage(name)
    path = sqlite_path(url)
    if path is not None and path.is_file() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
        # a study that cannot be written (its file or folder read-only) still opens for reading
        sqlite_file.check(path)
        return optuna.storages.RDBStorage("sqlite://", engine_kwargs={"creator": lambda: _read_only(path)})
    if url.startswith("sqlite:///"):
        with _creating(url):
            if path is not None:  # an empty, foreign or vanished study file is named, never made a new study
                sqlite_file.check(path)
            store = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"factory": _WalSqlite}})
        if path is not None and path.is_file():
            sqlite_file.watch(store.engine, path)  # deleted or replaced mid-study: stop, save what is open
        return store
    if url.startswith(("postgresql", "mysql")):  # several workers: heartbeat + one retry (tuner.study.workers)
        return shared_storage(url)
    return optuna.storages.RDBStorage(url)  # what Optuna makes of the URL itself


#: Study -> the storage handle it was opened with (:func:`opened`).
_HANDLES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def opened(study: optuna.Study, storage: Any) -> optuna.Study:
    """``study``, with ``storage`` (the :func:`optuna_storage` it was opened with) kept
    as its handle for :func:`storage_of`."""
    _HANDLES[study] = storage
    return study


def storage_of(study: optuna.Study, url: str | None = None) -> Any:
    """The storage handle of ``study`` (an ``optuna.storages.BaseStorage``): the one tuner
    opened it with (:func:`opened`), else one opened on ``url`` (the database the caller
    knows the study is in), else ``None``. Its public methods (``get_trial``,
    ``set_trial_user_attr``, ``get_trial_id_from_study_id_trial_number``, ...) reach the
    study's trials by id."""
    handle = _HANDLES.get(study)
    if handle is None and url is not None:
        handle = _HANDLES[study] = optuna_storage(url, study.study_name)
    return handle


def trial_id(storage: Any, study: optuna.Study, number: int) -> int:
    """The storage's id of the study's trial ``number`` (what its trial methods take)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def _read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to ``path``; on a read-only folder or mount, where SQLite
    cannot make its -shm file, as ``immutable`` (nothing can change it from here either).
    Writes through it fail as "attempt to write a readonly database" (:func:`storage_fault`)."""
    uri = f"file:{path.resolve()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.OperationalError:
        return sqlite3.connect(uri + "&immutable=1", uri=True, check_same_thread=False)


def _creating(url: str) -> Any:
    """Held while Optuna opens a SQLite file: the first opening creates its tables and
    stamps ``alembic_version``, and two processes doing it at once fail ("table studies
    already exists", "UNIQUE constraint failed: alembic_version"). A lock file beside the
    database (:class:`~tuner.study.locks.StudyLock`) serialises it; where none can be made (a
    read-only folder) nothing is created either, so none is needed."""
    import contextlib

    try:
        lock = StudyLock(url, "*", "schema")
    except OSError:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def held() -> Any:
        try:
            with lock.holding():
                yield
        finally:
            lock.close()

    return held()


def is_shared(url: str | None) -> bool:
    """True for storages several processes may write at once (anything but SQLite)."""
    return bool(url) and not str(url).startswith("sqlite")


def heartbeat_s() -> int:
    """Heartbeat interval in whole seconds (Optuna's unit): ``TUNER_HEARTBEAT_S`` or 60."""
    raw = os.environ.get(HEARTBEAT_ENV, "").strip()
    if not raw:
        return DEFAULT_HEARTBEAT_S
    try:
        value = int(float(raw))
    except ValueError:
        value = 0
    if value < 1:
        raise InputError(f"{HEARTBEAT_ENV}={raw!r} is not a whole number of seconds >= 1")
    return value


def shared_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage for a server database, with heartbeat and one retry of a
    trial whose worker died."""

    beat = heartbeat_s()
    # Optuna creates its tables on first use; two workers starting on an empty database
    # race there (duplicate key on alembic_version), so creation is serialised.
    schema_lock = StudyLock(url, "*", "schema") if url.startswith("postgresql") else None
    if schema_lock is not None:
        schema_lock.acquire()
    try:
        return _rdb_storage(url, beat)
    finally:
        if schema_lock is not None:
            schema_lock.close()


def _rdb_storage(url: str, beat: int) -> optuna.storages.RDBStorage:
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            driver_url(url), heartbeat_interval=beat, grace_period=GRACE_FACTOR * beat,
            heartbeat_stale_trial_callback=RetryOnce(),
            engine_kwargs={"pool_pre_ping": True},
        )


#: User attrs a retry keeps from the failed trial (what the run itself wrote is dropped).
KEEP_ON_RETRY = ("warm_start", "rerun_of_night")

#: System attrs of a trial's run (not carried to its retry); see :data:`tuner.study.workers.MEASURING`.
RUN_STATE_PREFIX = "tuner:"


class RetryOnce:
    """Optuna's ``RetryHeartbeatStaleTrialCallback(max_retry=1)``, handed the dead trial
    without what its run already wrote: its constraint (Optuna keeps the first value set,
    so the retry's own would be ignored), its run state (``tuner:`` system attrs, such as
    the claim that it measures its parameters) and partial results. The WAITING copy keeps the
    parameters and ``failed_trial`` / ``retry_history`` in its system attrs."""

    def __init__(self, max_retry: int = MAX_RETRY) -> None:
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._inner = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)

    def __call__(self, study: optuna.Study, trial: Any) -> None:
        clean = copy.deepcopy(trial)
        clean.system_attrs = {k: v for k, v in trial.system_attrs.items()
                              if k != "constraints" and not k.startswith(("constraints:", RUN_STATE_PREFIX))}
        kept = TrialRecord.from_trial(trial)
        clean.user_attrs = TrialRecord(**{k: getattr(kept, k) for k in KEEP_ON_RETRY}).to_attrs()
        self._inner(study, clean)


def storage_open_error(err: BaseException, shown: str, url: str | None = None) -> InputError | None:
    """The one line for a storage that cannot be opened, as every command says it; None
    when ``err`` is something else. ``shown`` is the URL as the user may see it; with ``url``
    (the URL itself) a server that could not be reached is told apart from one that answered,
    by trying it (:func:`tuner.core.urls.unreachable`): an unknown host, a refused or
    unanswered connection, or the server's own answer (bad credentials, no such database)."""

    lines = str(err).splitlines() or [type(err).__name__]
    if isinstance(err, ImportError):
        missing = next((e.name for e in _chain(err) if isinstance(e, ImportError) and e.name), None)
        return InputError(f"cannot open study storage {shown!r}: its database driver is not installed"
                          + (f" (no module {missing!r})" if missing else f" ({redact(lines[0])})"),
                          hint="for PostgreSQL: pip install 'tuner[postgres]'; for another database, the "
                               "SQLAlchemy driver its URL names")
    if isinstance(err, (ValueError, TypeError)):
        return InputError(f"cannot open study storage {shown!r}: {redact(lines[0])}",
                          hint="give an SQLAlchemy URL such as sqlite:///studies/x.db")
    if not type(err).__module__.startswith("sqlalchemy"):
        return None
    why = unreachable(url) if url and is_shared(url) else None
    if why is not None:
        return InputError(f"cannot reach the study database {shown}: {why}; nothing was read or written",
                          hint="check the host name in the URL" if why.startswith("unknown host") else
                          "start the database server, or check the host and port in the URL")
    if url and is_shared(url) and getattr(err, "orig", None) is not None:
        said = " ".join(str(err.orig).split())  # type: ignore[attr-defined]  # the driver's own words
        return InputError(f"the database server of {shown} answered but the connection failed: {redact(said)}; "
                          "nothing was read or written",
                          hint="check the user name, password and database name in the URL")
    return InputError(f"cannot open study storage {shown!r}: {redact(lines[0])}",
                      hint="check the URL, the server and the credentials")


def _chain(err: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    e: BaseException | None = err
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


# -- faults ---------------------------------------------------------------------------
#: What a database says when the study cannot be written (SQLite, PostgreSQL wording).
_STORAGE_FAULTS = (
    ("disk_full", ("database or disk is full", "no space left on device", "could not extend file")),
    ("storage", ("attempt to write a readonly database", "unable to open database file", "disk i/o error",
                 "server closed the connection", "connection refused", "could not connect to server",
                 "terminating connection", "connection to server")),
)


def guard_storage(fn: Any) -> Any:
    """Decorator: a failure to write the study anywhere inside ``fn`` (keyword ``storage``,
    else the SQLite files under ``studies/``) becomes the one-line :func:`storage_fault`."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            out = fn(*args, **kwargs)
        except TunerError:  # already one line of its own (an endpoint refusing is no storage fault)
            raise
        except Exception as err:
            if (gone := lost()) is not None:  # the study file vanished under it: that is what happened
                raise gone from err
            fault = storage_fault(err, kwargs.get("storage") or f"{STUDIES_DIR}/")
            if fault is None:
                raise
            raise fault from err
        if (gone := lost()) is not None:  # its writes since went to a file no one can open again
            raise gone
        return out

    return wrapper


def _disk_full(where: str) -> bool:
    import shutil

    path = sqlite_path(where) if where.startswith("sqlite") else Path(where)
    folder = path if path is not None and path.is_dir() else (path.parent if path is not None else None)
    try:
        return folder is not None and shutil.disk_usage(folder).free < (1 << 20)
    except OSError:
        return False


def _read_only_file(where: str) -> bool:
    path = sqlite_path(where) if where.startswith("sqlite") else None
    if path is None and not where.startswith(("sqlite", "postgresql", "mysql")):  # studies/ or a study's name
        path = Path(where) if where.endswith(".db") else STUDIES_DIR / f"{where.rstrip('/')}.db"
        if where.rstrip("/") == str(STUDIES_DIR):
            return STUDIES_DIR.is_dir() and not os.access(STUDIES_DIR, os.W_OK)
    if path is None or not path.parent.is_dir():
        return False
    return not os.access(path.parent, os.W_OK) or (path.is_file() and not os.access(path, os.W_OK))


def storage_fault(err: BaseException, where: str) -> EnvironmentFault | None:
    """The :class:`EnvironmentFault` behind ``err`` when its chain holds a database that
    cannot be written (a full disk, a read-only file, a lost server), else None."""

    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e).lower()
        if (own := file_fault(text, where)) is not None:  # a damaged file, or one at ulimit -f (EFBIG)
            return own
        for kind, needles in _STORAGE_FAULTS:
            if any(n in text for n in needles):
                if kind == "storage" and _disk_full(where):
                    kind = "disk_full"  # SQLite says "disk I/O error" when even its -shm file cannot grow
                what = "no space left on its disk: free space there" if kind == "disk_full" else \
                    "it cannot be written now (read-only, or the database server went away)"
                if kind == "storage" and _read_only_file(where):
                    what = ("it is read-only (no write permission on the file or its folder): it can be read "
                            "(tuner studies show, plan, report --out DIR), not written; fix the permissions")
                return EnvironmentFault(kind, f"cannot write the study to {redact(where)}: {what}; every trial "
                                        "finished before this is kept, and a trial cut short is measured again "
                                        "on the next run", path=where)
        e = e.__cause__ or e.__context__
    return None

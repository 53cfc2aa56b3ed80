"""A study's SQLite file, as a file: checked when tuner opens it, watched before each
commit, saved when it vanishes, never silently replaced by a new study.

* :func:`check` — before a study file is opened: a file that is empty (0 bytes: a disk
  that filled, a copy cut short) or not SQLite, or a missing file whose write-ahead log is
  still there, or one a run saved when it vanished (:func:`rescue`), is
  :class:`StudyFileFault` naming it (exit 2), never "a new study".
* :func:`watch` — before each commit that writes, the path is still the file the storage
  opened (its device and inode). A file deleted or replaced mid-study would otherwise take
  every commit after it into an unlinked inode, lost when the run ends while it reports
  success. The loss is noted there (a commit inside Optuna's own bookkeeping must not fail:
  Optuna cannot recover from a failed write of a trial's end); :func:`lost` gives the
  :class:`StudyFileFault` saying what happened, once :func:`rescue` saved the study the
  process still holds open beside it, as ``<name>.recovered-<time>.db``. The search asks
  after each trial and stops; every command guarded by
  :func:`tuner.study.storage.guard_storage` asks before it returns.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from tuner.core.errors import EnvironmentFault
from tuner.study.locks import sqlite_path

#: The first 16 bytes of every SQLite database file.
HEADER = b"SQLite format 3\x00"

#: Study files found deleted or replaced and not told yet: path -> (the inode opened, what happened).
_GONE: dict[str, tuple[tuple[int, int], str]] = {}


class StudyFileFault(EnvironmentFault):
    """A study's SQLite file is empty, not SQLite, gone or replaced (``kind`` ``study_file``)."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__("study_file", message, path=str(path))


def recovered_copies(path: Path) -> list[Path]:
    """The copies :func:`rescue` saved of the study file ``path``, newest last."""
    return sorted(path.parent.glob(f"{path.stem}.recovered-*.db"))


def check(path: Path) -> None:
    """Raise :class:`StudyFileFault` when the study file ``path`` cannot be a study's
    (see the module docstring); a missing file with nothing of it left is a new study."""
    if path.is_file():
        with open(path, "rb") as fh:
            head = fh.read(len(HEADER))
        if not head:
            raise StudyFileFault(f"{path} is empty (0 bytes): the study it held is gone (a disk that filled, a copy "
                                 "cut short, a file truncated); tuner does not start a new one over it: restore it "
                                 "from a backup, or delete the file to start a new study", path)
        if head != HEADER:
            raise StudyFileFault(f"{path} is not an SQLite database (it begins {head!r}): restore the study from a "
                                 "backup, or move the file away to start a new study", path)
        return
    if copies := recovered_copies(path):
        raise StudyFileFault(f"{path} is missing, and {copies[-1]} holds the study a run saved when the file "
                             f"vanished: move it back (mv {copies[-1]} {path}) and run the same command to go on, or "
                             "delete it to start a new study", path)
    wal = path.with_name(path.name + "-wal")
    if wal.is_file() and wal.stat().st_size > 0:
        raise StudyFileFault(f"{path} is missing but its write-ahead log {wal} is there: the study file was deleted "
                             f"or moved; put it back, or delete {wal} and {path.name}-shm to start a new study", path)


def watch(engine: Any, path: Path) -> None:
    """Before each commit that writes on ``engine``, check that ``path`` is still the file
    opened now; note it when not (:func:`lost` says so)."""
    from sqlalchemy import event

    st = os.stat(path)
    ident = (st.st_dev, st.st_ino)

    told = False  # once told, this storage's later writes are known lost

    def before_commit(conn: Any) -> None:
        nonlocal told
        if told or str(path) in _GONE or not _writes(conn):
            return
        try:
            now = os.stat(path)
        except FileNotFoundError:
            _GONE[str(path)], told = (ident, "deleted"), True
        else:
            if (now.st_dev, now.st_ino) != ident:
                _GONE[str(path)], told = (ident, "replaced by another file"), True

    event.listen(engine, "commit", before_commit)


def lost() -> StudyFileFault | None:
    """The fault of a study file found deleted or replaced in this process and not told yet
    (its study saved by :func:`rescue` now), or None. Each is told once."""
    if not _GONE:
        return None
    path = next(iter(_GONE))
    ident, what = _GONE.pop(path)
    return lost_fault(Path(path), ident, what)


#: What SQLite says of a file that is not (or no longer) a sound database.
_CORRUPT = ("database disk image is malformed", "file is not a database")


def file_fault(text: str, where: str) -> EnvironmentFault | None:
    """The study file's own fault behind a database error ``text`` (lower case) on the SQLite
    study ``where`` (a URL, or the studies folder): a damaged file, or one that reached this
    process's file size limit (``ulimit -f``: EFBIG, which SQLite reports as a full disk or
    an I/O error); None for anything else."""
    import resource

    path = sqlite_path(where) if where.startswith("sqlite") else None
    files = [path] if path is not None else sorted(Path(where).glob("*.db")) if Path(where).is_dir() else []
    if any(n in text for n in _CORRUPT):
        shown = path or where
        return EnvironmentFault("corrupt", f"the study file {shown} is damaged (SQLite: {text[:80]}): tuner doctor "
                                "checks it; restore it from a backup", path=str(shown))
    if not any(n in text for n in ("disk i/o error", "database or disk is full", "file too large")):
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    sizes = {f: f.stat().st_size for db in files for f in (db, db.with_name(db.name + "-wal"),
                                                            db.with_name(db.name + "-journal")) if f.is_file()}
    big = max(sizes, key=sizes.get, default=None)
    if big is None or sizes[big] + 65536 < soft:
        return None
    return EnvironmentFault("file_too_large", f"cannot write the study to {big.parent / big.name}: it reached this "
                            f"process's file size limit (ulimit -f: {soft // 1024:,} KiB; the file holds "
                            f"{sizes[big] // 1024:,} KiB): raise the limit (ulimit -f unlimited) and run the same "
                            "command to go on; every trial finished before this is kept", path=str(big))


def _writes(conn: Any) -> bool:
    """The transaction being committed on SQLAlchemy connection ``conn`` wrote something
    (sqlite3 opens a transaction only for a write); True when that cannot be told."""
    with contextlib.suppress(AttributeError):
        return bool(conn.connection.dbapi_connection.in_transaction)
    return True


def lost_fault(path: Path, ident: tuple[int, int], what: str) -> StudyFileFault:
    """The fault of a study file ``what`` (deleted, replaced) mid-study, after :func:`rescue`."""
    try:
        copy, finished = rescue(path, ident, remove_log=what == "deleted")
    except (OSError, sqlite3.Error) as err:
        saved = f"it could not be saved ({err}); the trials since it vanished are lost"
    else:
        saved = (f"the study as this run held it ({finished} finished trials) is saved in {copy}: move it back "
                 f"(mv {copy} {path}) and run the same command to go on" if copy is not None else
                 "this process no longer held it open, so nothing of it could be saved")
    return StudyFileFault(f"the study file {path} was {what} while this run wrote to it, so the run stopped "
                          f"before losing more; {saved}", path)


def rescue(path: Path, ident: tuple[int, int], *, remove_log: bool = False) -> tuple[Path | None, int]:
    """Copy the study file this process still holds open (the inode ``ident``, with its
    write-ahead log) to ``<name>.recovered-<time>.db`` beside ``path``, checkpointed; the
    copy and its finished trials (None, 0 when no descriptor holds it). ``remove_log``: the
    file was deleted, so its write-ahead log left at the path (this inode's) goes too, lest it
    meet a study put back there."""
    db_fd = wal_fd = None
    wal_path = os.path.abspath(f"{path}-wal")  # this study's log, not another study's of the same name
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            st = os.fstat(int(fd))
            target = os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
            if (st.st_dev, st.st_ino) == ident:
                db_fd = db_fd or fd
            elif target == wal_path:
                wal_fd = wal_fd or fd
    if db_fd is None:
        return None, 0
    copy = path.with_name(f"{path.stem}.recovered-{time.strftime('%Y%m%dT%H%M%S')}.db")
    shutil.copyfile(f"/proc/self/fd/{db_fd}", copy)
    if wal_fd is not None:
        shutil.copyfile(f"/proc/self/fd/{wal_fd}", f"{copy}-wal")
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finished = conn.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
        conn.execute("PRAGMA journal_mode=DELETE")
    wal = path.with_name(path.name + "-wal")
    with contextlib.suppress(OSError):
        if remove_log and wal_fd is not None and os.stat(wal).st_ino == os.fstat(int(wal_fd)).st_ino:
            wal.unlink()
            path.with_name(path.name + "-shm").unlink(missing_ok=True)
    return copy, int(finished)


__all__ = ["HEADER", "StudyFileFault", "check", "file_fault", "lost", "lost_fault", "recovered_copies", "rescue",
           "watch"]

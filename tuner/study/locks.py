"""Named locks on a study, held by one process at a time: a PostgreSQL advisory lock, a
lock file beside a SQLite database, or nothing for other storages (:class:`StudyLock`);
and the URL helpers they share with :mod:`tuner.study.storage`."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError


class StudyBusy(InputError):
    """Another process holds the study (a SQLite search, or a nightly run)."""


def process_label() -> str:
    """This process as ``host:pid``: how locks, trials and servers name who holds them."""
    return f"{socket.gethostname()}:{os.getpid()}"


def driver_url(url: str) -> str:
    """``url`` with a PostgreSQL driver that is installed: SQLAlchemy 2.1 reads a bare
    ``postgresql://`` as psycopg 3; with only psycopg2 (the ``postgres`` extra) installed,
    that becomes ``postgresql+psycopg2://``."""
    import importlib.util

    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL (None for in-memory)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def _lock_key(purpose: str, study: str) -> int:
    """A signed 64-bit advisory lock key for ``purpose`` on ``study``."""
    return int.from_bytes(hashlib.sha256(f"tuner:{purpose}:{study}".encode()).digest()[:8], "big", signed=True)


class StudyLock:
    """A named lock on one study: a PostgreSQL advisory lock (session level, on its own
    connection, released when the connection closes — also when the process dies), a
    lock file beside a SQLite database (``fcntl.flock``, released by the kernel when the
    process dies), or nothing for other storages."""

    def __init__(self, url: str, study: str, purpose: str) -> None:
        self.url = url
        self.study = study
        self.purpose = purpose
        self.kind = "none"
        self._conn: Any = None
        self._engine: Any = None
        self._fd: int | None = None
        self._held = False
        if url.startswith("postgresql"):
            import sqlalchemy
            from sqlalchemy.pool import NullPool

            self.kind = "postgresql"
            self._key = _lock_key(purpose, study)
            # the holder is named in pg_stat_activity, so a refused run can say who holds it
            self._engine = sqlalchemy.create_engine(
                driver_url(url), poolclass=NullPool,
                connect_args={"application_name": f"tuner {purpose} {process_label()}"[:63]},
            )
            self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        else:
            path = sqlite_path(url)
            if path is not None:
                self.kind = "file"
                self.path = path.with_name(f"{path.name}.{purpose}.lock")
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock; False when ``blocking`` is off and someone else holds it."""
        if self._held or self.kind == "none":
            self._held = True
            return True
        if self.kind == "postgresql":
            from sqlalchemy import text

            if blocking:
                self._conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
            elif not self._conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self._key}).scalar():
                return False
        else:
            assert self._fd is not None
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                return False
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{process_label()}\n".encode(), 0)
        self._held = True
        return True

    def holder(self) -> str:
        """Who holds the lock (``host:pid``), as far as the lock file or PostgreSQL says."""
        if self.kind == "file":
            with contextlib.suppress(OSError):
                return self.path.read_text().strip() or "another process"
        if self.kind == "postgresql":
            from sqlalchemy import text

            # a bigint advisory key shows in pg_locks as classid (high 32 bits), objid (low)
            key = self._key & 0xFFFFFFFFFFFFFFFF
            with contextlib.suppress(Exception):
                row = self._conn.execute(text(
                    "SELECT a.application_name, a.client_addr, a.pid FROM pg_locks l "
                    "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                    "AND l.classid = :hi AND l.objid = :lo AND l.objsubid = 1"),
                    {"hi": key >> 32, "lo": key & 0xFFFFFFFF}).first()
                if row is not None:
                    name = str(row[0] or "").removeprefix(f"tuner {self.purpose} ")
                    return name or f"PostgreSQL backend {row[2]} from {row[1]}"
        return "another process"

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        if self.kind == "postgresql":
            from sqlalchemy import text

            self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
        elif self.kind == "file":
            assert self._fd is not None
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the lock for a block (blocking): taken and released here, unless this
        process already holds it, in which case whoever took it releases it."""
        if self._held:
            yield
            return
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.release()
        if self._conn is not None:
            self._conn.close()
            self._engine.dispose()
            self._conn = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StudyLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["StudyBusy", "StudyLock", "driver_url", "process_label", "sqlite_path"]

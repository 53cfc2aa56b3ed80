"""The log folder's check before a server starts: :func:`check_writable` (it exists, takes
a file and has :data:`MIN_FREE_BYTES` free; else an :class:`~tuner.core.errors.EnvironmentFault`)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from tuner.core.errors import EnvironmentFault

#: A start is refused as an environment fault when the log folder has less free space.
MIN_FREE_BYTES = 64 * 2**20


def check_writable(folder: Path, *, what: str) -> None:
    """``folder`` exists (made if need be), takes a file and has :data:`MIN_FREE_BYTES` free;
    else :class:`EnvironmentFault` naming the path and what to do."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".tuner-write-check-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        kind = "disk_full" if err.errno == 28 else "storage"
        raise EnvironmentFault(kind, f"cannot write {what} {folder}: {err.strerror}", path=str(folder)) from err
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        raise EnvironmentFault("disk_full", f"{what} {folder} has {free / 2**20:.0f} MiB free; free at least "
                               f"{MIN_FREE_BYTES / 2**20:.0f} MiB there (old logs: studies/*/logs/)", path=str(folder))

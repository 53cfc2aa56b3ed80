"""Files tuner writes for the user (reports, plans, exports) are whole or absent.

:func:`write_atomic` writes beside the target and renames over it (``os.replace``), so a
full disk or a killed process never leaves a truncated or 0-byte file where a complete
one is expected; a failure removes the partial file and raises
:class:`~tuner.core.errors.EnvironmentFault` naming the path and what to free.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from tuner.core.errors import EnvironmentFault


def write_atomic(path: str | Path, data: bytes | str, *, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` all at once (see the module docstring)."""
    target = Path(path)
    blob = data.encode(encoding) if isinstance(data, str) else data
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_fault(target, err) from err
    return target


def write_fault(path: Path, err: OSError) -> EnvironmentFault:
    """The one-line fault for a failed write to ``path``."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
            room = f" ({free / 2**20:.0f} MiB free)"
        except OSError:
            room = ""
        return EnvironmentFault("disk_full", f"cannot write {path}: no space left on its disk{room}; free space "
                                "there (old studies/*/logs/ and reports) and run the command again", path=str(path))
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return EnvironmentFault("storage", f"cannot write {path}: {err.strerror} (a read-only or foreign folder); "
                                "write elsewhere with --out/--report-dir or fix the permissions", path=str(path))
    return EnvironmentFault("storage", f"cannot write {path}: {err.strerror or err}", path=str(path))


__all__ = ["write_atomic", "write_fault"]

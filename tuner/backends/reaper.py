"""A watchdog that stops this process's servers when it dies, however it dies.

``PR_SET_PDEATHSIG`` (:func:`tuner.runtime.processes.die_with_parent`) reaches only the direct
child: a launcher script that does not ``exec`` the server dies on it and leaves the
server running. So the first server a process starts also starts one *reaper*: ``python
-m tuner.backends.reaper`` in a session of its own, reading the process groups to watch
from a pipe (``+PGID`` / ``-PGID`` lines). The pipe's only writer is this process; when
it ends (an exit, a crash, SIGKILL) the reaper reads end-of-file and stops every group
still listed (SIGTERM, SIGKILL after the grace), through :func:`tuner.runtime.processes.stop_group`,
which signals only groups with a member carrying tuner's marker, and then every process
still carrying its parent's marker (:func:`tuner.runtime.processes.stop_marked`): a server
a launcher put in another group (coreutils ``timeout``) or daemonized (``setsid nohup``).
"""
from __future__ import annotations

import subprocess
import sys
import threading

from tuner.runtime.processes import stop_group, stop_marked

#: Seconds between SIGTERM and SIGKILL when the reaper stops a group.
GRACE_S = 10.0

_lock = threading.Lock()
_proc: subprocess.Popen | None = None
_groups: set[int] = set()  # what the running reaper watches


def _write(line: str) -> None:
    try:
        assert _proc is not None and _proc.stdin is not None
        _proc.stdin.write(line + "\n")
        _proc.stdin.flush()
    except (BrokenPipeError, OSError):
        pass


def watch(pgid: int) -> None:
    """Stop process group ``pgid`` when this process ends, unless :func:`forget` first."""
    global _proc
    with _lock:
        if _proc is None or _proc.poll() is not None:
            _proc = subprocess.Popen([sys.executable, "-m", "tuner.backends.reaper"], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                     text=True, close_fds=True)
        _write(f"+{pgid}")
        _groups.add(pgid)


def forget(pgid: int) -> None:
    """``pgid`` was stopped: no longer watched. With nothing left to watch the reaper is
    closed (end-of-file with an empty list: it exits at once), so none outlives its use."""
    global _proc
    with _lock:
        if _proc is None or pgid not in _groups:
            return
        _groups.discard(pgid)
        _write(f"-{pgid}")
        if not _groups:
            try:
                assert _proc.stdin is not None
                _proc.stdin.close()
                _proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
            _proc = None


def main() -> int:
    """The reaper: read ``+PGID``/``-PGID`` until end-of-file, then stop what is listed
    and what carries the marker of the process that started it."""
    import os

    owner = os.getppid()  # the tuner process, read before it can die
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line[:1] in "+-" and line[1:].isdigit():
            (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
    for pgid in sorted(groups):
        stop_group(pgid, grace_s=GRACE_S)
    if groups:  # the parent died with servers running: whatever else carries its marker goes too
        stop_marked(owner=owner, grace_s=GRACE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())

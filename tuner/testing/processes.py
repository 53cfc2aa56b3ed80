"""Every process a test starts is gone when it ends (:func:`no_leftover_processes`)."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

#: Seconds the processes a test started get to exit after it ends.
GRACE_S = 5.0


@contextlib.contextmanager
def no_leftover_processes(grace_s: float = GRACE_S) -> Iterator[None]:
    """Fails (``AssertionError``) when a child process started inside the block still runs
    ``grace_s`` after it (zombies, exited but not yet reaped, do not count)."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + grace_s
    while True:
        alive = [p for p in me.children(recursive=True)
                 if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not alive, f"processes left running: {[(p.pid, p.cmdline()) for p in alive]}"


__all__ = ["no_leftover_processes"]

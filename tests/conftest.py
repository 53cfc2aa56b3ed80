"""Fixtures shared across test folders."""
from __future__ import annotations

import pytest

from tuner.testing import processes


@pytest.fixture
def no_leftover_processes():
    """Every process a test starts must be gone when it ends (asked for with
    ``pytest.mark.usefixtures`` or by an autouse fixture of a folder's conftest)."""
    with processes.no_leftover_processes():
        yield


@pytest.fixture(autouse=True)
def _host_wide(request, tmp_path_factory):
    """Tests marked ``host_wide`` run alone on the host when the suite runs in parallel
    (pytest-xdist workers share one process table): a server such a test leaves for the
    next run to find is stale to every ``tuner search`` on the host, and another worker's run
    would stop it first. Every test takes the shared side of one lock, a host-wide test the
    exclusive side; a turnstile lock in front lets no new test in while one waits for it."""
    import fcntl
    import os

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    root = tmp_path_factory.getbasetemp().parent  # shared by the workers of one run
    exclusive = request.node.get_closest_marker("host_wide") is not None
    with open(root / "host-wide.turnstile", "a") as gate, open(root / "host-wide.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)

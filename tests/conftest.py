"""Fixtures shared across test folders."""
from __future__ import annotations

import time

import psutil
import pytest


@pytest.fixture
def no_leftover_processes():
    """Every process a test starts must be gone when it ends (asked for with
    ``pytest.mark.usefixtures`` or by an autouse fixture of a folder's conftest)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + 5
    while True:
        alive = [p for p in me.children(recursive=True)
                 if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not alive, f"processes left running: {[(p.pid, p.cmdline()) for p in alive]}"

"""Fixtures for replay tests: stand-in servers as real processes on OS-given ports, and a
check that no process a test started outlives it."""
from __future__ import annotations

import pytest
from stand_ins import start_bad, start_stub, stop_stub


@pytest.fixture(autouse=True)
def _every_test_checks_leftover_processes(no_leftover_processes):
    """Every process a test starts must be gone when it ends (tests/conftest.py)."""
    yield


@pytest.fixture
def stub():
    """A stand-in server (5 ms steps, 256 slots); yields its base URL."""
    proc, url = start_stub()
    try:
        yield url
    finally:
        stop_stub(proc)


@pytest.fixture(scope="module")
def bad():
    """One bad-answer stand-in for a module (the model a request names picks the answer)."""
    proc, url = start_bad()
    try:
        yield url
    finally:
        stop_stub(proc)

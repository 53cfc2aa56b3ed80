"""Fixtures for replay tests: stand-in servers as real processes on OS-given ports, and a
check that no process a test started outlives it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.backends.vllm import free_port, start_local_server

STUB = Path(__file__).with_name("stub_server.py")
BAD = Path(__file__).with_name("bad_server.py")
REPO = Path(__file__).resolve().parents[2]


def start_stub(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return start_local_server([sys.executable, str(STUB), "--port", str(port), *args], port,
                              what="stub server", env=env)


def start_bad(*args: str) -> tuple[subprocess.Popen, str]:
    """The stand-in that answers badly on purpose (bad_server.py; ``--mode``, ``--key``)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return start_local_server([sys.executable, str(BAD), "--port", str(port), *args], port,
                              what="bad server", env=env)


def stop_stub(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


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

"""Fixtures for replay tests: stand-in servers as real processes on OS-given ports, and a
check that no process a test started outlives it."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

STUB = Path(__file__).with_name("stub_server.py")
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_stub(*args: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(STUB), "--port", str(port), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"stub server exited with {proc.returncode}")
            time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("stub server did not start")


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

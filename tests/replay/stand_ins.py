"""Start and stop the replay tests' stand-in servers (stub_server.py, bad_server.py,
recorded_server.py) as real processes on OS-given ports. A module of its own, not
conftest: several test folders have a conftest, and only one of them can be imported
under that name."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tuner.backends.local_server import free_port, start_local_server

STUB = Path(__file__).with_name("stub_server.py")
BAD = Path(__file__).with_name("bad_server.py")
RECORDED = Path(__file__).with_name("recorded_server.py")
REPO = Path(__file__).resolve().parents[2]


def start_stub(*args: str) -> tuple[subprocess.Popen, str]:
    """The stand-in engine behind tuner.sim.server.SimServer (stub_server.py)."""
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


def start_recorded(*args: str) -> tuple[subprocess.Popen, str]:
    """The stand-in that plays one recorded stream with known timings (recorded_server.py)."""
    port = free_port()
    return start_local_server([sys.executable, str(RECORDED), "--port", str(port), *args], port,
                              what="recorded server")


def stop_stub(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)

"""Local servers and small HTTP calls: :func:`free_port`, :func:`start_local_server` (test
and benchmark servers: ``tuner sim-serve``, stand-ins) and :func:`_http` (one JSON request,
its status and body)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tuner.core.errors import BackendError


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start_local_server(argv: list[str], port: int, *, what: str = "server", timeout_s: float = 30.0,
                       env: dict[str, str] | None = None, cwd: str | Path | None = None,
                       ) -> tuple[subprocess.Popen, str]:
    """Start ``argv`` (a server that listens on ``port`` of 127.0.0.1) in a process group of
    its own, output discarded, and wait until ``/health`` answers: ``(process, base URL)``.
    Raises :class:`BackendError` when it exits first or does not answer within
    ``timeout_s`` (then it is killed). For test and benchmark servers (``tuner sim-serve``,
    stand-ins); real vLLM starts through :class:`VllmBackend`, which keeps its log."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise BackendError(f"{what} exited with {proc.returncode} before answering /health") from None
            time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    raise BackendError(f"{what} did not answer {url}/health within {timeout_s:g} s")


def _http(url: str, *, data: dict | None = None, timeout: float = 5.0,
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()

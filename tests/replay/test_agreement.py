"""The replayer's TTFT is the server's TTFT: against `tuner sim-serve` (the real simulated
engine, in real time) with 256 concurrent streams, per-request client TTFT agrees with the
server's own (handler start → first chunk handed to the socket) within 2 ms at P95, and
the client stays under one core.

The first wave (the 256 requests sent together at t=0, which also open 256 connections)
is left out: there the server's accept/parse queue, which the server cannot time itself,
dominates. From then on requests arrive as others finish, as in steady serving."""
from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from tuner.load import Concurrency
from tuner.replay import replay
from tuner.traffic.workload import Workload

USERS = 256


def _sleep_overshoot_p95(n: int = 200, period: float = 0.002) -> float:
    late = []
    for _ in range(n):
        t = time.perf_counter()
        time.sleep(period)
        late.append(time.perf_counter() - t - period)
    return float(np.percentile(late, 95))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@pytest.mark.slow
def test_client_ttft_matches_server_ttft_at_256_streams():
    # A 2 ms check means nothing on a machine whose other work delays either process by
    # more than that: measure the scheduling delay first (idle Linux: ~0.1 ms).
    jitter = _sleep_overshoot_p95()
    if jitter > 0.0005:
        pytest.skip(f"machine busy: a 2 ms sleep overshoots by {jitter * 1e3:.1f} ms at P95")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tuner.sim.server", "qwen2.5-7b", "--gpu", "H100-SXM",
                             "--port", str(port), "--max-model-len", "4096", "--max-num-seqs", "256"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        rng = np.random.default_rng(7)
        n = 4 * USERS
        w = Workload(arrival_s=np.zeros(n), prompt_tokens=rng.integers(64, 1024, n),
                     output_tokens=rng.integers(16, 128, n))
        c0, t0 = _cpu(), time.perf_counter()
        r = replay(url, w, Concurrency(USERS), tag="agree")
        cores = (_cpu() - c0) / (time.perf_counter() - t0)
        with urllib.request.urlopen(url + "/debug/timings", timeout=30) as resp:
            timings = json.loads(resp.read())
        with urllib.request.urlopen(url + "/debug/loop", timeout=30) as resp:
            loop = json.loads(resp.read())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert r.error == [None] * n
    if loop["late_p95_s"] > 0.002:
        pytest.skip(f"the server could not keep real time (steps ended {loop['late_p95_s'] * 1e3:.1f} ms "
                    "late at P95): the machine is busy")
    steady = np.arange(USERS, n)
    server = np.array([timings[f"agree-{i}"]["ttft_s"] for i in steady])
    diff = np.abs(r.ttft_s[steady] - server)
    p95 = float(np.percentile(diff, 95))
    print(f"|client - server| TTFT: P50 {np.percentile(diff, 50) * 1e3:.2f} ms, P95 {p95 * 1e3:.2f} ms; "
          f"client {cores:.2f} cores")
    assert r.server["num_requests_running_max"] <= USERS
    assert p95 < 0.002
    assert cores < 1.0

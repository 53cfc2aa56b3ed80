"""The replayer's TTFT is the server's TTFT: against `tuner sim-serve` (the real simulated
engine, in real time) with 256 concurrent streams, every request is served, the server saw
every request id, and per request the client's intervals contain the server's (arrival →
first chunk, arrival → last chunk): vLLM's TTFT and E2E (from just before the POST to the
chunk as the client processes it) and tuner's kernel-stamped TTFT (body handed to the
socket → the kernel's receive stamp of the first chunk).

Containment holds however busy the machine is: the client stamps its start and its send
before the bytes go out, and a chunk when it processes it or by the kernel's receive stamp
(SO_TIMESTAMPNS); the server stamps a request's arrival by the kernel's receive stamp
(handler start for a connection's first request, later still) and a chunk just before
handing it to the socket; both clocks are CLOCK_MONOTONIC (perf_counter), kernel stamps
converted to it within microseconds. A busy machine can only widen the client's interval.
How close the kernel-stamped TTFT comes (0.1 ms at P95 idle) is a wall-clock figure:
``python benchmarks/ttft_agreement.py`` prints it idle and busy."""
from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request

import numpy as np
import pytest

from tuner.backends.local_server import free_port, start_local_server
from tuner.replay import replay
from tuner.serving.load import Concurrency
from tuner.traffic.workload import Workload

USERS = 256
#: Kernel stamps converted from CLOCK_REALTIME on both sides (each within microseconds).
CLOCK_EPS_S = 0.001


@pytest.mark.slow
def test_client_ttft_contains_server_ttft_at_256_streams():
    port = free_port()
    proc, url = start_local_server(
        [sys.executable, "-m", "tuner.sim.server", "qwen2.5-7b", "--gpu", "H100-SXM", "--port", str(port),
         "--max-model-len", "4096", "--max-num-seqs", str(USERS)], port, what="sim-serve", timeout_s=120)
    try:
        rng = np.random.default_rng(7)
        n = 2 * USERS  # the first wave over new connections, then one over kept-alive ones
        w = Workload(arrival_s=np.zeros(n), prompt_tokens=rng.integers(64, 1024, n),
                     output_tokens=rng.integers(16, 128, n))
        r = replay(url, w, Concurrency(USERS), tag="agree")
        with urllib.request.urlopen(url + "/debug/timings", timeout=30) as resp:
            timings = json.loads(resp.read())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert r.error == [None] * n, sorted({e for e in r.error if e})
    assert r.server["num_requests_running_max"] <= USERS
    # the server saw every request under the id the client sent, and served what was asked
    ids = [f"agree-{i}" for i in range(n)]
    assert set(ids) <= set(timings) and all("ttft_s" in timings[k] for k in ids)
    server = {key: np.array([timings[k][key] for k in ids]) for key in ("ttft_s", "e2e_s", "output_tokens",
                                                                      "prompt_tokens")}
    assert (server["output_tokens"] == w.output_tokens).all() and (r.output_tokens == w.output_tokens).all()
    assert (server["prompt_tokens"] == w.prompt_tokens).all() and (r.prompt_tokens == w.prompt_tokens).all()
    # containment, per request: a client that stamped the first token at the response
    # headers, its send late, or another request's chunks would come out shorter
    assert (r.ttft_s >= r.ttft_kernel_s).all()  # vLLM's interval holds the kernel-stamped one
    for name, ours in (("ttft_s", r.ttft_s), ("ttft_s", r.ttft_kernel_s), ("e2e_s", r.e2e_s)):
        short = np.flatnonzero(ours < server[name] - CLOCK_EPS_S)
        assert len(short) == 0, [(int(i), round(float(ours[i] - server[name][i]) * 1e3, 3)) for i in short[:5]]
    # and the typical request agrees: a deliberately loose bound (a tenth of the median
    # TTFT; the kernel-stamped gap is ~0.03 ms idle and with 6 CPU hogs) that catches a
    # client timing from another moment (the run's start, a queue) rather than measuring
    # closeness
    gap = np.abs(r.ttft_kernel_s - server["ttft_s"])[USERS:]
    assert np.median(gap) < 0.1 * np.median(server["ttft_s"])

"""A replay whose every stream stalled at once is told from one that served (hand-worked
stalls, and a real sim-serve paused with SIGSTOP mid-replay)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

from tuner.replay.disruption import MIN_STALL_S, StallWatch, disruption, stall_limit
from tuner.serving.result import RunResult


def test_the_longest_stall_counts_only_time_with_a_stream_mid_answer():
    w = StallWatch()
    w.first(0.0)
    w.first(0.1)
    w.chunk(0.2)
    w.chunk(0.3)
    w.chunk(20.3)          # both streams waited 20 s for this chunk
    w.end(20.4)
    w.end(20.5)
    w.first(60.0)          # 39.5 s with no stream mid-answer: queueing or a prefill, not a stall
    w.end(60.1)
    w.close(61.0)
    assert w.longest == pytest.approx(20.0) and w.at == pytest.approx(0.3) and w.streams == 2


def test_streams_cut_mid_answer_stall_until_the_end_of_the_run():
    w = StallWatch()
    w.first(1.0)
    w.chunk(1.5)
    w.close(9.5)           # the server went silent; the replay ended (stopped) 8 s later
    assert w.longest == pytest.approx(8.0) and w.streams == 1


def result(stall_s: float, itl_s: list[float]) -> RunResult:
    n = 4
    return RunResult(send_s=np.zeros(n), ttft_s=np.full(n, 0.1), e2e_s=np.full(n, 1.0),
                     prompt_tokens=np.full(n, 100), output_tokens=np.full(n, 50), error=[None] * n,
                     duration_s=30.0, itl_s=np.array(itl_s), stall_s=stall_s, stall_at_s=3.0, stall_streams=4,
                     load_label="4 users")


def test_a_stall_is_a_disruption_beyond_ten_times_the_inter_token_tail_and_two_seconds():
    gaps = [0.05] * 90 + [0.4] * 10                 # the replay's own tail: 0.4 s (prefills holding decodes)
    assert stall_limit(result(0.0, gaps)) == pytest.approx(4.0)
    assert disruption(result(3.5, gaps)) is None            # under ten times the tail
    assert stall_limit(result(0.0, [0.01] * 100)) == MIN_STALL_S  # never under 2 s
    assert disruption(result(20.0, gaps + [20.0] * 4)) is not None  # the stall's own gaps do not raise the tail
    assert "stalled at once for 20.0 s" in disruption(result(20.0, gaps + [20.0] * 4))
    # a study whose own serving pauses 3 s (its inter-token tail) calls a 20 s stall its
    # serving's, and one over ten times that a disruption
    assert disruption(result(20.0, gaps), study_tail_s=3.0) is None
    assert disruption(result(31.0, gaps), study_tail_s=3.0) is not None
    assert stall_limit(result(0.0, [])) == MIN_STALL_S


@pytest.mark.slow
def test_a_server_paused_mid_replay_stalls_every_stream_and_the_replay_says_so(tmp_path):
    from tuner.backends.local_server import free_port, start_local_server
    from tuner.replay import replay
    from tuner.serving.load import Concurrency
    from tuner.traffic.workload import Workload

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    server, url = start_local_server([sys.executable, "-m", "tuner", "sim-serve", "qwen2.5-7b", "--speed", "5",
                                      "--max-model-len", "4096", "--port", str(port)], port, env=env, timeout_s=120)
    w = Workload(arrival_s=np.zeros(48), prompt_tokens=np.full(48, 200), output_tokens=np.full(48, 200))
    pause = 3.0
    try:
        calm = replay([url], w.take(slice(0, 16)), Concurrency(8))
        stop = threading.Timer(0.8, os.kill, (server.pid, signal.SIGSTOP))
        cont = threading.Timer(0.8 + pause, os.kill, (server.pid, signal.SIGCONT))
        stop.start()
        cont.start()
        t0 = time.monotonic()
        paused = replay([url], w, Concurrency(8))
        assert time.monotonic() - t0 > 0.8 + pause  # the replay outlasted the pause
    finally:
        os.kill(server.pid, signal.SIGCONT)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert paused.stall_s >= 0.8 * pause and paused.stall_streams >= 1
    assert disruption(paused) is not None and "stalled at once" in disruption(paused)
    assert calm.stall_s < pause and disruption(calm) is None

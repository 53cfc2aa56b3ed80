"""The replayer against stand-in servers running as real processes."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
from stand_ins import start_stub, stop_stub

from tuner.core.errors import BackendError, InputError
from tuner.replay import replay
from tuner.replay.bodies import _body
from tuner.serving.load import Concurrency, Poisson, TraceReplay, arrival_times
from tuner.traffic.workload import Request, Workload


def _workload(n: int, seed: int = 0, out=(3, 40), span_s: float = 0.0) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(arrival_s=np.sort(rng.uniform(0, span_s, n)) if span_s else np.zeros(n),
                    prompt_tokens=rng.integers(5, 400, n), output_tokens=rng.integers(*out, n))


def test_closed_loop_forces_logged_lengths_and_times_every_chunk(stub):
    w = _workload(60)
    r = replay([stub], w, Concurrency(8))
    assert r.error == [None] * 60 and not r.stopped_early
    assert (r.prompt_tokens == w.prompt_tokens).all()   # from the server's usage chunk
    assert (r.output_tokens == w.output_tokens).all()   # max_tokens = min_tokens = logged
    assert (r.ttft_s > 0).all() and (r.e2e_s >= r.ttft_s).all()
    # the stand-in sends one chunk per token: one gap per token after the first
    assert len(r.itl_s) == int((w.output_tokens - 1).sum())
    assert r.server["num_requests_running_max"] <= 8
    assert r.server["metrics_samples"] >= 1 and r.server["num_gpu_blocks"] == 1000


def test_open_loop_never_sends_before_the_schedule(stub):
    w = _workload(40, span_s=1.0)
    load = Poisson(rate=40.0, seed=3)
    r = replay(stub, w, load, metrics=False)
    planned = arrival_times(load, w.arrival_s)
    assert r.error == [None] * 40
    assert planned[0] == 0 and planned[-1] > 0.5  # a real schedule, spread over most of a second
    # the scheduler starts each request at or after its time, in schedule order (exact:
    # a busy machine can only make it late) ...
    assert (r.issue_s >= planned).all()
    assert np.all(np.diff(r.issue_s) >= 0)
    # ... and its bytes go to the socket after that (connection set-up may reorder sends
    # issued close together, so send order is not asserted)
    assert (r.send_s >= r.issue_s).all()
    assert r.load_label == "40 req/s"


def test_trace_replay_compresses_logged_times(stub):
    w = _workload(10, span_s=2.0)
    r = replay(stub, w, TraceReplay(4.0), metrics=False)
    assert r.error == [None] * 10
    assert r.send_s[-1] == pytest.approx(w.arrival_s[-1] / 4.0, abs=0.2)


def test_stop_hook_ends_the_run_and_marks_unsent_requests():
    proc, url = start_stub("--step-s", "0.02")
    try:
        w = _workload(200, out=(20, 30))
        seen = []

        def stop(control):
            seen.append((control.finished, control.sent, len(control.ttft_s)))
            return control.finished >= 10

        t = time.monotonic()
        r = replay(url, w, Concurrency(10), stop=stop, metrics=False)
        assert time.monotonic() - t < 10
    finally:
        stop_stub(proc)
    assert r.stopped_early
    assert r.error.count(None) >= 10
    assert "not_sent" in r.error  # 200 requests, stopped after ~10
    assert set(r.error) <= {None, "not_sent", "cancelled"}
    assert seen[-1][0] == 10 and seen[-1][2] == 10
    assert np.isnan(r.ttft_s[[e == "not_sent" for e in r.error]]).all()


def test_two_replicas_share_the_load(stub):
    proc, url2 = start_stub()
    try:
        r = replay([stub, url2], _workload(40), Concurrency(8), router="least_outstanding")
    finally:
        stop_stub(proc)
    assert r.error == [None] * 40
    # both replicas ran requests (the metrics of each are summed)
    assert r.server["prefix_cache_queries"] > 0 and len(r.server["endpoints"]) == 2


def test_http_errors_are_recorded_per_request(stub):
    # prompts longer than the stand-in's 4096-token context are refused with HTTP 400
    w = Workload(arrival_s=np.zeros(4), prompt_tokens=np.array([10, 5000, 20, 6000]),
                 output_tokens=np.array([2, 2, 2, 2]))
    r = replay(stub, w, Concurrency(2), metrics=False)
    assert r.error == [None, "http_400", None, "http_400"]
    assert np.isnan(r.ttft_s[[1, 3]]).all()
    assert r.summary()["error_rate"] == 0.5


def test_slow_server_gives_timeouts():
    proc, url = start_stub("--step-s", "0.5")
    try:
        r = replay(url, _workload(3, out=(50, 60)), Concurrency(3), timeout_s=0.3, metrics=False)
    finally:
        stop_stub(proc)
    assert r.error == ["timeout"] * 3


def test_dead_server_is_a_backend_error_or_disconnects(stub):
    proc, url = start_stub()
    stop_stub(proc)
    with pytest.raises(BackendError, match="/v1/models"):
        replay(url, _workload(3), Concurrency(1))
    r = replay(url, _workload(3), Concurrency(1), model="m", metrics=False)
    assert r.error == ["disconnect"] * 3


def test_chat_api_streams_too(stub):
    r = replay(stub, _workload(10), Concurrency(4), api="chat", metrics=False)
    assert r.error == [None] * 10 and (r.ttft_s > 0).all()


def test_prompts_have_logged_length_and_share_logged_prefixes():
    w = Workload.from_requests([
        Request(0.0, 40, 5, hash_ids=(7, 8, 9)),
        Request(0.1, 35, 5, hash_ids=(7, 8, 4)),
        Request(0.2, 40, 5),
    ], block_tokens=16)
    bodies = [json.loads(_body(w, i, "m", "completions", salt=0)) for i in range(3)]
    p = [b["prompt"] for b in bodies]
    assert [len(x) for x in p] == [40, 35, 40]
    assert p[0][:32] == p[1][:32] and p[0][32:35] != p[1][32:35]  # two shared blocks
    assert p[0][:16] != p[2][:16]
    assert bodies[0]["max_tokens"] == bodies[0]["min_tokens"] == 5 and bodies[0]["ignore_eos"]
    assert bodies[0]["stream_options"] == {"include_usage": True}


def test_bad_inputs_are_input_errors():
    with pytest.raises(InputError):
        replay("localhost:8000", _workload(1), Concurrency(1))
    with pytest.raises(InputError):
        replay("http://127.0.0.1:9", _workload(1), Concurrency(1), api="embeddings")


@pytest.mark.parametrize("open_loop", [False, True], ids=["closed", "open"])
def test_a_replay_cancelled_from_outside_logs_nothing_left_unretrieved(stub, caplog, open_loop):
    """A stop signal cancels the replay's task mid-run: every request task ends with it and
    nothing is left for asyncio to report later as an exception never retrieved (which
    printed a traceback under tuner's one-line 'interrupted' message)."""
    import asyncio
    import gc
    import logging

    from tuner.replay.client import replay_async

    w = _workload(400, out=(200, 400), span_s=0.5 if open_loop else 0.0)
    load = Poisson(rate=800.0, seed=1) if open_loop else Concurrency(32)

    async def main() -> None:
        task = asyncio.ensure_future(replay_async([stub], w, load, metrics=False))
        await asyncio.sleep(0.3)  # requests in flight (each streams 200-400 chunks at 5 ms a step)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]

"""The virtual-time engine: vLLM bench definitions, loads, replicas, stop hook, anchors."""
from __future__ import annotations

import numpy as np
import pytest

from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency, Poisson, TraceReplay
from tuner.sim.engine import simulate
from tuner.traffic.workload import Workload

H200 = Deployment(model="qwen2.5-7b", gpu="H200")
H200_CFG = ServeConfig(gpu_memory_utilization=0.9, max_model_len=4096)


def fixed(n: int, prompt: int, out: int, arrival: np.ndarray | None = None) -> Workload:
    arr = np.zeros(n) if arrival is None else arrival
    return Workload(arrival_s=arr, prompt_tokens=np.full(n, prompt), output_tokens=np.full(n, out))


@pytest.mark.parametrize("eager,tpot_ms", [(False, 4.76), (True, 17.8)])
def test_h200_decode_tpot_anchor(eager: bool, tpot_ms: float) -> None:
    # vLLM 0.26.0, one H200, Qwen2.5-7B bf16, concurrency 1 (../shared/tools/h200-vllm/README.md).
    # The anchors of the Hopper class table: pinned to it, since the fitted H200 profile
    # (tuner/data/calibration/h200-vllm-0.26.0) now applies by default; its own check is
    # tests/test_fidelity.py (eager TPOT measured 13.7-17.8 ms across runs).
    from tuner.sim.calibration import load_calibration
    from tuner.sim.hardware import get_gpu

    res = simulate(H200, H200_CFG.replace(enforce_eager=eager), fixed(3, 512, 256), Concurrency(1),
                   profile=load_calibration(get_gpu("H200")))
    tpot = np.nanmean(res.tpot_s) * 1e3
    assert tpot == pytest.approx(tpot_ms, rel=0.03)


def test_closed_loop_keeps_users_in_flight_and_orders_sends() -> None:
    res = simulate(H200, H200_CFG, fixed(12, 300, 50), Concurrency(3))
    assert all(e is None for e in res.error)
    # sends happen in workload order, the first three at once
    assert np.all(np.diff(res.send_s) >= 0)
    assert np.count_nonzero(res.send_s == 0.0) == 3
    # each later send coincides with some completion
    done = res.send_s + res.e2e_s
    for t in res.send_s[3:]:
        assert np.isclose(done, t).any()


def test_open_loop_sends_at_arrival_times_and_ttft_le_e2e() -> None:
    w = fixed(50, 800, 40, arrival=np.arange(50) * 0.05)
    res = simulate(H200, H200_CFG, w, TraceReplay(1.0))
    assert np.allclose(res.send_s, w.arrival_s)
    assert np.all(res.ttft_s <= res.e2e_s)
    assert np.all(res.queue_s >= 0)
    assert res.duration_s == pytest.approx(np.max(res.send_s + res.e2e_s))


def test_stop_hook_marks_unsent() -> None:
    res = simulate(H200, H200_CFG, fixed(20, 200, 30), Concurrency(2), stop=lambda c: c.finished >= 4)
    assert res.stopped_early
    assert sum(e is None for e in res.error) == 4
    assert "not_sent" in res.error
    assert np.isnan(res.ttft_s[[e is not None for e in res.error]]).all()


def test_prompt_longer_than_max_model_len_is_refused_per_request() -> None:
    w = Workload(arrival_s=np.zeros(2), prompt_tokens=np.array([5000, 100]), output_tokens=np.array([10, 10]))
    res = simulate(H200, H200_CFG, w, Poisson(rate=10))
    assert res.error == ["http_400", None]


def _with_front_end(cost_s: float):
    from tuner.sim.calibration import load_calibration
    from tuner.sim.hardware import get_gpu

    return load_calibration(get_gpu("H200"), vllm_version="0.26.0").replace(frontend_per_token_s=cost_s)


@pytest.mark.parametrize("fast", [True, False])
def test_a_slow_front_end_delivers_tokens_at_its_own_pace(fast: bool) -> None:
    # one user, 40 output tokens: the engine decodes a token in ~4.7 ms, the front end
    # hands one over every 20 ms; the user sees the front end's pace, FIFO after the engine
    slow = _with_front_end(0.020)
    res = simulate(H200, H200_CFG, fixed(1, 200, 40), Concurrency(1), profile=slow, fast=fast)
    assert float(res.tpot_s[0]) == pytest.approx(0.020, rel=1e-6)
    plain = simulate(H200, H200_CFG, fixed(1, 200, 40), Concurrency(1), fast=fast,
                     profile=_with_front_end(0.0))
    # the first token: the prefill step, then 20 ms in the front end
    assert float(res.ttft_s[0]) == pytest.approx(float(plain.ttft_s[0]) + 0.020, rel=1e-6)
    assert float(plain.tpot_s[0]) < 0.006


@pytest.mark.parametrize("fast", [True, False])
def test_the_front_end_queue_is_shared_by_every_request_of_a_replica(fast: bool) -> None:
    # 4 users: each engine step emits 4 tokens, 4 x 5 ms = 20 ms of front end a step, so each
    # user gets a token every 20 ms although the engine steps every ~5 ms; the next request
    # of a closed-loop user goes out when its user got the last token
    res = simulate(H200, H200_CFG, fixed(8, 200, 30), Concurrency(4), profile=_with_front_end(0.005), fast=fast)
    assert all(e is None for e in res.error)
    assert np.nanmedian(res.tpot_s) == pytest.approx(0.020, rel=0.05)
    done = res.send_s + res.e2e_s
    for t in res.send_s[4:]:
        assert np.isclose(done, t).any()
    # throughput is the front end's: at most 1 / 5 ms = 200 output tokens/s
    assert res.summary()["output_tokens_per_s"] <= 200 * 1.001


def _front(token_s: float, request_s: float):
    from tuner.sim.calibration import load_calibration
    from tuner.sim.hardware import get_gpu

    return load_calibration(get_gpu("H200"), vllm_version="0.26.0").replace(
        frontend_per_token_s=token_s, frontend_per_request_s=request_s, request_latency_s=0.0)


@pytest.mark.parametrize("fast", [True, False])
def test_the_front_end_takes_requests_in_one_at_a_time(fast: bool) -> None:
    # 8 users send at once and the front end takes each in for 10 ms: the engine sees the k-th
    # at (k+1) x 10 ms and schedules it within one step (~5 ms here) of that
    res = simulate(H200, H200_CFG, fixed(8, 200, 5), Concurrency(8), profile=_front(0.0, 0.010), fast=fast)
    assert all(e is None for e in res.error)
    q = np.sort(res.queue_s)
    taken_in = 0.010 * np.arange(1, 9)
    assert np.all(q >= taken_in - 1e-9) and np.all(q < taken_in + 0.008)
    # without the cost they are all scheduled at once
    assert np.all(simulate(H200, H200_CFG, fixed(8, 200, 5), Concurrency(8), profile=_front(0.0, 0.0),
                           fast=fast).queue_s == 0.0)


def test_requests_and_tokens_share_the_front_end_first_come_first_served() -> None:
    from tuner.sim.memory import plan_memory
    from tuner.sim.scheduler import EngineCore

    core = EngineCore(plan_memory(H200, H200_CFG), _front(0.010, 0.005))
    core.add_request("A", 16, 3)
    adv = core.advance(defer=True)             # A's prefill step, ending at e1 (~4 ms)
    e1 = adv.end_s
    t = e1 / 2                                 # B reaches the idle front end during that step
    assert core.frontend_admit(t) == pytest.approx(t + 0.005)
    core.commit()                              # A's first token queues behind B's intake
    assert core.requests.t_first[0] == pytest.approx(max(t + 0.005, e1) + 0.010)
    # C arrives while that token is still being streamed: it waits for it
    busy_until = core.requests.t_first[0]
    assert core.frontend_admit(e1) == pytest.approx(busy_until + 0.005)


def test_a_request_arriving_during_a_backlog_waits_for_it_twice() -> None:
    # 4 long streams from t=0: the engine emits ~870 tokens/s, a 2 ms-a-token front end
    # streams 500/s, so at t=1 s it is ~0.75 s behind. A fifth request then: without an
    # intake cost it is prefilled at once and its first token waits behind that backlog
    # (TTFT ~0.75 s); taken in by the same front end, it first waits for the backlog to
    # reach the engine, then its first token waits behind what the engine emitted meanwhile
    from tuner.serving.load import TraceReplay

    w = fixed(5, 200, 1000, arrival=np.array([0.0, 0.0, 0.0, 0.0, 1.0]))
    plain = simulate(H200, H200_CFG, w, TraceReplay(1.0), profile=_front(0.002, 0.0))
    taken = simulate(H200, H200_CFG, w, TraceReplay(1.0), profile=_front(0.002, 0.001))
    assert plain.queue_s[4] < 0.005 and 0.6 < plain.ttft_s[4] < 0.9
    assert taken.queue_s[4] == pytest.approx(plain.ttft_s[4], rel=0.05)    # it reached the engine after the backlog
    assert taken.ttft_s[4] > 2.5 * plain.ttft_s[4]


@pytest.mark.parametrize("fast", [True, False])
def test_api_servers_share_the_front_ends_work(fast: bool) -> None:
    # the 4-user case above (a step's 4 tokens x 5 ms = 20 ms of front end, so a token every
    # 20 ms per user): with 2 API server processes each streams half the tokens, a token every
    # 10 ms; with 8 the engine's own ~5 ms step is the pace again, as without a front-end cost
    def tpot(servers: int | None, cost: float = 0.005) -> float:
        res = simulate(H200, H200_CFG.replace(api_server_count=servers), fixed(8, 200, 30), Concurrency(4),
                       profile=_with_front_end(cost), fast=fast)
        assert all(e is None for e in res.error)
        return float(np.nanmedian(res.tpot_s))

    assert tpot(None) == pytest.approx(0.020, rel=0.05) and tpot(1) == pytest.approx(tpot(None), rel=1e-9)
    assert tpot(2) == pytest.approx(0.010, rel=0.05)
    engine = tpot(None, 0.0)
    assert engine < 0.006 and tpot(8) == pytest.approx(max(engine, 0.005 * 4 / 8), rel=0.1)


def test_api_servers_take_requests_in_side_by_side() -> None:
    # 8 users at once, 10 ms of intake each: one process lets the k-th in at (k+1) x 10 ms; four
    # let them in four at a time (as one queue four times as fast: the k-th at (k+1) x 2.5 ms)
    res = simulate(H200, H200_CFG.replace(api_server_count=4), fixed(8, 200, 5), Concurrency(8),
                   profile=_front(0.0, 0.010))
    q = np.sort(res.queue_s)
    taken_in = 0.0025 * np.arange(1, 9)
    assert np.all(q >= taken_in - 1e-9) and q[-1] < 0.010 * 8 / 2

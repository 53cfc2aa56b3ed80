"""The V1 scheduler (EngineCore): hand-worked cases and invariants on small KV pools."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency, Poisson
from tuner.sim.engine import run_plan
from tuner.sim.memory import plan_memory
from tuner.sim.scheduler import EngineCore, shared_units
from tuner.traffic.workload import Workload

BASE = plan_memory(Deployment(model="qwen2.5-7b", gpu="H100-SXM"), ServeConfig(max_model_len=4096))


def small_plan(**kw):
    """A real plan shrunk to a handful of blocks (the scheduler only reads these fields)."""
    kw.setdefault("block_size", 4)
    kw.setdefault("num_gpu_blocks", 7)
    kw.setdefault("max_num_batched_tokens", 64)
    kw.setdefault("max_num_seqs", 8)
    kw.setdefault("enable_prefix_caching", False)
    return BASE.replace(**kw)


def drive(core: EngineCore, fast: bool = False, check=None) -> list[str]:
    """Step until idle; returns request ids in the order they finished."""
    order: list[str] = []
    for _ in range(100_000):
        if not core.has_work():
            return order
        if fast:
            adv = core.advance()
            order += [core.ids[j] for j in adv.finished]
        else:
            order += core.step().finished
        if check:
            check(core)
    raise AssertionError("engine did not drain")


def conserved(core: EngineCore) -> None:
    pool = core.scheduler.pool
    assert pool.free + core.blocks_in_use() == core.plan.num_gpu_blocks - 1
    assert sum(pool._lru.values()) == pool.free
    assert 0.0 <= pool.usage() <= 1.0


def test_two_requests_tiny_pool_preempts_the_later_one() -> None:
    # 6 usable blocks of 4 tokens = 24 token slots. A and B: 8-token prompts, 14 outputs each
    # (8 + 13 computed tokens = 6 blocks: either fits alone, not both).
    core = EngineCore(small_plan())
    core.step_log = []
    core.add_request("A", 8, 14)
    core.add_request("B", 8, 14)
    first = core.step()
    assert first.new_tokens == {"A": 1, "B": 1}       # both prefills fit (2 blocks each)
    preempt_step = None
    for i in range(200):
        out = core.step()
        if out.num_preempted:
            preempt_step = i
            break
        conserved(core)
    # A and B hold 3 blocks each at 12 tokens; A's 13th token needs a 7th block: B (the last
    # running) is preempted, A keeps running.
    assert preempt_step is not None
    assert out.new_tokens.get("A") == 1 and "B" not in out.new_tokens
    assert core.stats()["num_running"] == 1 and list(core.scheduler.waiting) == [1]
    assert core.step_log[-1][3] == 0          # no admission in the step that preempted
    assert drive(core, check=conserved) == ["A", "B"]
    assert core.scheduler.num_preemptions >= 1
    assert int(core.requests.out[0]) == 14 and int(core.requests.out[1]) == 14


def test_whole_prompt_must_fit_before_admission() -> None:
    # 6 free blocks; A takes 4 (16-token prompt), B's 12-token prompt needs 3: it waits
    # even though the budget has room, and is admitted once A finishes.
    core = EngineCore(small_plan(num_gpu_blocks=7, max_num_batched_tokens=64))
    core.add_request("A", 16, 2)
    core.add_request("B", 12, 2)
    out = core.step()
    assert out.new_tokens == {"A": 1}
    assert list(core.scheduler.waiting) == [1]
    assert drive(core) == ["A", "B"]


def test_token_budget_chunks_prefill_and_decodes_go_first() -> None:
    core = EngineCore(small_plan(num_gpu_blocks=200, max_num_batched_tokens=16))
    core.step_log = []
    core.add_request("A", 4, 5)
    core.step()                                 # A prefilled, now decoding
    core.add_request("B", 40, 3)
    out = core.step()                           # A decodes (1 token), B gets a 15-token chunk
    assert out.new_tokens == {"A": 1}
    assert core.step_log[-1][0] == 16
    core.step()
    core.step()                                 # 15 + 15 + 10 of B's 40 prompt tokens
    assert core.stats()["num_running"] == 2
    assert not math.isnan(core.requests.t_first[1])



def test_long_prefill_token_threshold_cuts_a_long_prompt_into_chunks_of_its_size() -> None:
    # vLLM's scheduler: a request asking more than a positive threshold in one step gets the
    # threshold. A 40-token prompt under a 16-token budget: 16 + 16 + 8 (3 steps) without it;
    # 8 x 5 (5 steps) with a threshold of 8.
    for threshold, chunks in ((0, [16, 16, 8]), (8, [8, 8, 8, 8, 8])):
        core = EngineCore(small_plan(num_gpu_blocks=200, max_num_batched_tokens=16,
                                     long_prefill_token_threshold=threshold or None))
        core.step_log = []
        core.add_request("A", 40, 2)
        for _ in chunks:
            assert math.isnan(core.requests.t_first[0])
            core.step()
        assert [entry[0] for entry in core.step_log] == chunks and not math.isnan(core.requests.t_first[0])


def test_a_short_prompt_beside_a_long_one_starts_sooner_under_the_threshold() -> None:
    # budget 16; A (40 tokens) then B (6) arrive together. Without a threshold A takes the
    # whole budget for two steps and B's first token comes in step 3 (A 8 + B 6); with 8,
    # step 1 holds A's 8 and B's 6, and B's first token comes in step 1.
    firsts = {}
    for threshold in (0, 8):
        core = EngineCore(small_plan(num_gpu_blocks=200, max_num_batched_tokens=16,
                                     long_prefill_token_threshold=threshold or None))
        core.add_request("A", 40, 2)
        core.add_request("B", 6, 2)
        steps = 0
        while math.isnan(core.requests.t_first[1]):
            core.step()
            steps += 1
        firsts[threshold] = steps
    assert firsts == {0: 3, 8: 1}


def test_a_threshold_above_every_prompt_changes_nothing() -> None:
    plan = small_plan(num_gpu_blocks=400, max_num_batched_tokens=48, max_num_seqs=6)
    w = random_workload(40, 3, prompt=(5, 60))
    same = [run_plan(plan.replace(long_prefill_token_threshold=t or None), w, Concurrency(6)) for t in (0, 60)]
    assert same[0].server["engine_steps"] == same[1].server["engine_steps"]
    assert np.array_equal(same[0].ttft_s, same[1].ttft_s)
    capped = run_plan(plan.replace(long_prefill_token_threshold=8), w, Concurrency(6))
    assert capped.server["engine_steps"] > same[0].server["engine_steps"]  # long prompts now take more steps
    assert int(capped.output_tokens.sum()) == int(same[0].output_tokens.sum())  # and every token still comes

def test_max_num_seqs_caps_running() -> None:
    core = EngineCore(small_plan(num_gpu_blocks=500, max_num_seqs=3, max_num_batched_tokens=256))
    for i in range(7):
        core.add_request(str(i), 10, 4)
    core.step()
    assert core.stats()["num_running"] == 3 and core.stats()["num_waiting"] == 4


def random_workload(n: int, seed: int, prompt=(5, 60), out=(1, 40), rate: float | None = None) -> Workload:
    rng = np.random.default_rng(seed)
    arr = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1 / rate, n)) - 0.0
    arr -= arr[0]
    return Workload(arrival_s=arr, prompt_tokens=rng.integers(*prompt, n),
                    output_tokens=rng.integers(*out, n))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_invariants_every_step(seed: int) -> None:
    plan = small_plan(num_gpu_blocks=40, max_num_batched_tokens=48, max_num_seqs=6,
                      enable_prefix_caching=seed == 2)
    w = random_workload(60, seed)
    core = EngineCore(plan)
    core.step_log = []
    for i, r in enumerate(w):
        core.add_request(str(i), r.prompt_tokens, r.output_tokens)
    finished = drive(core, fast=seed == 1, check=conserved)
    assert sorted(finished, key=int) == [str(i) for i in range(60)]      # each exactly once
    assert len(set(finished)) == 60
    log = np.array(core.step_log)
    assert log[:, 0].max() <= plan.config.max_num_batched_tokens
    assert log[:, 1].max() <= plan.config.max_num_seqs
    assert not np.any((log[:, 2] > 0) & (log[:, 3] > 0))              # no admission when preempting
    assert log[:, 2].sum() > 0                                          # the pool was tight
    np.testing.assert_array_equal(core.requests.out[:60], np.minimum(w.output_tokens, plan.config.max_model_len - w.prompt_tokens))  # noqa: E501


@pytest.mark.parametrize("load", [Concurrency(8), Poisson(rate=30.0, seed=3), Concurrency(40)])
@pytest.mark.parametrize("blocks", [30, 400])
def test_fast_path_equals_step_by_step(load, blocks: int) -> None:
    plan = small_plan(num_gpu_blocks=blocks, max_num_batched_tokens=64, max_num_seqs=16,
                      enable_prefix_caching=True)
    w = random_workload(80, 5, prompt=(5, 50), out=(5, 120))
    fast = run_plan(plan, w, load, fast=True, record_itl=True)
    slow = run_plan(plan, w, load, fast=False, record_itl=True)
    assert fast.error == slow.error
    np.testing.assert_allclose(fast.ttft_s, slow.ttft_s, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fast.e2e_s, slow.e2e_s, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.sort(fast.itl_s), np.sort(slow.itl_s), rtol=1e-9, atol=1e-12)
    assert fast.server["num_preemptions"] == slow.server["num_preemptions"]
    assert fast.server["engine_steps"] == slow.server["engine_steps"]


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
@pytest.mark.parametrize("load", [Concurrency(30), Poisson(rate=60.0, seed=4)])
def test_fast_path_equals_step_by_step_with_replicas(router: str, load) -> None:
    # decode runs are planned past the next arrival and cut when one is routed to them
    plan = small_plan(num_gpu_blocks=120, max_num_batched_tokens=64, max_num_seqs=16,
                      enable_prefix_caching=True)
    w = random_workload(150, 9, prompt=(5, 50), out=(5, 150))
    fast = run_plan(plan, w, load, replicas=3, router=router, fast=True)
    slow = run_plan(plan, w, load, replicas=3, router=router, fast=False)
    assert fast.error == slow.error
    np.testing.assert_allclose(fast.send_s, slow.send_s, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fast.ttft_s, slow.ttft_s, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fast.e2e_s, slow.e2e_s, rtol=1e-9, atol=1e-12)
    assert fast.server["engine_steps"] == slow.server["engine_steps"]


def test_more_kv_memory_never_lowers_throughput() -> None:
    w = random_workload(300, 7, prompt=(50, 600), out=(20, 300))
    tput = []
    for blocks in (60, 120, 240, 480, 960, 5000):
        plan = small_plan(num_gpu_blocks=blocks, block_size=16, max_num_batched_tokens=1024,
                          max_num_seqs=64, enable_prefix_caching=True)
        tput.append(run_plan(plan, w, Concurrency(64)).summary()["tokens_per_s"])
    assert all(b >= a * 0.999 for a, b in zip(tput, tput[1:])), tput
    assert tput[-1] > tput[0]


def test_prefix_hits_never_exceed_the_shared_prefix() -> None:
    # 30 requests: a system prompt of 3 ids (1536 tokens) shared by all, then 2 ids each of
    # their own; every 3rd request repeats the previous one's ids (a follow-up turn).
    rng = np.random.default_rng(0)
    hash_ids, prompts = [], []
    for i in range(30):
        ids = (1, 2, 3) + ((100 + i - 1, 200 + i - 1) if i % 3 == 2 else (100 + i, 200 + i))
        hash_ids.append(ids)
        prompts.append(5 * 512 - int(rng.integers(0, 100)))
    w = Workload(arrival_s=np.arange(30) * 0.5, prompt_tokens=np.array(prompts),
                 output_tokens=np.full(30, 20), hash_ids=hash_ids, block_tokens=512)
    plan = small_plan(num_gpu_blocks=2000, block_size=16, max_num_batched_tokens=2048,
                      max_num_seqs=16, enable_prefix_caching=True)
    res = run_plan(plan, w, Poisson(rate=2.0))
    for i in range(30):
        shared = 0
        for k in range(i):   # longest common prefix with any earlier request, in tokens
            common = 0
            for a, b in zip(hash_ids[i], hash_ids[k]):
                if a != b:
                    break
                common += 1
            shared = max(shared, min(common * 512, prompts[i], prompts[k]))
        assert res.cached_tokens[i] <= min(shared, prompts[i] - 1)
    assert res.cached_tokens[0] == 0
    assert np.all(res.cached_tokens[1:] >= 3 * 512)
    assert res.server["prefix_cache_hit_rate"] > 0.5


def test_shared_units_map_block_tokens_onto_block_size() -> None:
    units = shared_units((7, 8, 9), 512, 1100, 16)
    # 512-token pieces over 16-token blocks: 32 + 32 blocks, then 1100-1024 = 76 tokens -> 4 full blocks
    assert [n for _, n in units] == [32, 32, 4]
    same = shared_units((7, 8, 5), 512, 1100, 16)
    assert units[:2] == same[:2] and units[2] != same[2]
    assert shared_units((1, 2), 512, 1100, 48)[0][1] == 10     # blocks whose last token is in piece 0


def test_step_api_streams_every_token_once_and_abort_frees_blocks() -> None:
    core = EngineCore(small_plan(num_gpu_blocks=300, max_num_batched_tokens=32))
    outs = {"a": 7, "b": 12, "c": 1}
    for rid, n in outs.items():
        core.add_request(rid, 20, n)
    core.add_request("gone", 30, 50)
    got = dict.fromkeys(outs, 0)
    done = []
    clock = 0.0
    for _ in range(3):
        step = core.step()
        clock += step.duration_s
        for rid, n in step.new_tokens.items():
            got[rid] = got.get(rid, 0) + n
        done += step.finished
    core.abort("gone")
    assert core.scheduler.pool.free + core.blocks_in_use() == 299
    while core.has_work():
        step = core.step()
        assert step.duration_s > 0
        clock += step.duration_s
        for rid, n in step.new_tokens.items():
            got[rid] += n
        done += step.finished
    assert {k: got[k] for k in outs} == outs and sorted(done) == ["a", "b", "c"]
    assert core.now == pytest.approx(clock)
    stats = core.stats()
    assert stats["num_running"] == 0 and stats["kv_cache_usage"] == 0.0
    assert stats["generation_tokens"] >= sum(outs.values())
    assert set(stats) >= {"num_waiting", "num_preemptions", "prefix_cache_queries", "prefix_cache_hits",
                          "prompt_tokens"}


def test_repeated_prompt_hits_all_but_its_last_block() -> None:
    # the same 1,024-token prompt twice: the second finds all 64 blocks cached but must
    # compute its last token, so 63 blocks (1,008 tokens) count as hit
    plan = small_plan(num_gpu_blocks=500, block_size=16, max_num_batched_tokens=2048,
                      enable_prefix_caching=True)
    core = EngineCore(plan)
    core.add_request("first", 1024, 5, hash_ids=(11, 12), block_tokens=512)
    drive(core, check=conserved)
    core.add_request("again", 1024, 5, hash_ids=(11, 12), block_tokens=512)
    drive(core, check=conserved)
    assert int(core.requests.cached[0]) == 0 and int(core.requests.cached[1]) == 1008
    assert core.stats()["prefix_cache_hits"] == 1008

"""Hand-worked cases of each folding rule of tuner.study.effective, and of each case where a knob
must stay as it is."""
from __future__ import annotations

import pytest

from tuner.study.effective import ANY, caveat, effective_config, group_key, no_effect

#: vLLM 0.26 on an H200: the V1 engine. The longest request is 3,000 tokens, none share a prefix.
RUN = {"backend": "sim", "vllm_version": "0.26.0", "hardware": {"gpu": "H200", "gpu_count": 1},
       "workload_longest_tokens": 3000, "workload_shares_prefixes": False}
CONFIG = {"gpu_memory_utilization": 0.9, "max_num_seqs": 64, "max_model_len": 8192, "block_size": None,
          "max_num_batched_tokens": None, "enable_prefix_caching": True, "enforce_eager": False,
          "kv_cache_dtype": "auto", "tensor_parallel_size": 1, "replicas": 1}
QUIET = {"num_preemptions": 0}  # readings at the scored load


def fold(config=None, run=None, *, started=True, server=QUIET, **changes):
    return no_effect({**CONFIG, **(config or {})}, {**RUN, **(run or {}), **changes}, started=started, server=server)


def test_a_started_v1_trial_without_shared_prefixes_folds_both_knobs():
    assert fold() == {"enable_prefix_caching": "no shared prefixes",
                      "max_model_len": ">= 3,000 tokens, the longest request"}
    eff = effective_config(CONFIG, RUN, started=True, server=QUIET)
    assert eff["enable_prefix_caching"] == ANY and eff["max_model_len"] == ANY
    assert {k: v for k, v in eff.items() if v != ANY} == {k: v for k, v in CONFIG.items()
                                                          if k not in ("enable_prefix_caching", "max_model_len")}


def test_trials_differing_only_in_folded_knobs_share_a_group():
    key = group_key(CONFIG, RUN, started=True, server=QUIET)
    assert group_key({**CONFIG, "enable_prefix_caching": False, "max_model_len": 3000}, RUN,
                     started=True, server=QUIET) == key
    assert group_key({**CONFIG, "max_num_seqs": 128}, RUN, started=True, server=QUIET) != key
    assert group_key({**CONFIG, "gpu_memory_utilization": 0.8}, RUN, started=True, server=QUIET) != key


def test_prefix_caching_stays_when_requests_share_prefixes():
    assert "enable_prefix_caching" not in fold(workload_shares_prefixes=True)
    assert "max_model_len" in fold(workload_shares_prefixes=True)  # the other rule still holds


def test_prefix_caching_stays_when_requests_were_preempted_or_that_is_unknown():
    # a preempted request recomputed with caching on hits its own blocks kept in the cache
    assert "enable_prefix_caching" not in fold(server={"num_preemptions": 3})
    assert "enable_prefix_caching" not in fold(server={})
    assert "enable_prefix_caching" not in fold(server=None)


def test_max_model_len_below_the_longest_request_stays():
    assert "max_model_len" not in fold({"max_model_len": 2999})  # the 3,000-token request is cut
    assert "max_model_len" in fold({"max_model_len": 3000})      # it fits exactly


def test_max_model_len_of_a_trial_vllm_did_not_start_stays():
    # the length decides whether vLLM's startup check passes: a refused trial keeps it
    assert "max_model_len" not in fold(started=False)
    assert "enable_prefix_caching" in fold(started=False)


def test_max_model_len_stays_where_it_caps_the_default_token_budget():
    # budget unset: min(default, max_num_seqs x max_model_len); 4 x 3,000 = 12,000 < 16,384,
    # so a length of 3,000 and one of 8,192 give different budgets on a large GPU
    assert "max_model_len" not in fold({"max_num_seqs": 4})
    assert "max_model_len" in fold({"max_num_seqs": 4, "max_num_batched_tokens": 8192})
    assert "max_model_len" in fold({"max_num_seqs": 6})  # 6 x 3,000 = 18,000: the cap cannot bind
    assert "max_model_len" in fold({"max_num_seqs": None})  # vllm serve's default is at least 256


def test_the_default_max_model_len_is_read_from_the_trial_plan():
    assert "max_model_len" in fold({"max_model_len": None}, plan={"max_model_len": 32768})
    assert "max_model_len" not in fold({"max_model_len": None}, plan={"max_model_len": 2048})
    assert "max_model_len" not in fold({"max_model_len": None})  # length unknown


@pytest.mark.parametrize(("version", "gpu"), [
    ("0.9.2", "T4"),      # V0: V1 ran below compute capability 8.0 only from 0.10.2
    ("0.10.1", "V100-32GB-SXM2"),
    ("0.7.3", "H200"),    # V0 on every GPU before 0.8
])
def test_v0_folds_only_max_num_seqs(version, gpu):
    assert fold(vllm_version=version, hardware={"gpu": gpu}) == {}
    assert list(seqs_fold(vllm_version=version, hardware={"gpu": gpu})) == ["max_num_seqs"]


def seqs_fold(config=None, *, levels=(30, 21, 15), failing=21, started=True, **run):
    """The max_num_seqs rule alone: closed loop, max-num-seqs 64 unless ``config`` says."""
    folded = no_effect({**CONFIG, **(config or {})}, {**RUN, "load_kind": "concurrency", **run}, started=started,
                       server={"num_preemptions": 3}, levels=list(levels), failing=failing)
    return {k: v for k, v in folded.items() if k == "max_num_seqs"}


def test_max_num_seqs_folds_when_no_load_offered_more_users_and_the_target_placed_the_edge():
    # 30, 21 and 15 users against max-num-seqs 64; 21 missed the target, 15 met it
    assert seqs_fold() == {"max_num_seqs": "at most 30 users offered, never more than max-num-seqs"}
    assert seqs_fold({"max_num_seqs": 30}) != {}          # 30 users, 30 slots: nobody ever waited for one
    eff = effective_config({**CONFIG, "max_num_seqs": 64}, {**RUN, "load_kind": "concurrency"}, started=True,
                           levels=[30, 21, 15], failing=21)
    assert eff["max_num_seqs"] == ANY and eff["gpu_memory_utilization"] == 0.9


@pytest.mark.parametrize(("config", "kw", "why"), [
    ({"max_num_seqs": 16}, {"levels": (16, 18, 17), "failing": 18}, "18 users met 16 slots: the cap held some back"),
    ({"max_num_seqs": 8}, {"levels": (8,), "failing": None}, "the search stopped at its cap: it measured the cap"),
    ({}, {"load_kind": "rate", "levels": (2.0, 4.0), "failing": 4.0}, "open loop: in-flight requests are unbounded"),
    ({}, {"started": False}, "vLLM never started with it"),
    ({}, {"levels": ()}, "no load recorded"),
    ({"max_num_seqs": None}, {}, "vLLM's default, not known here"),
])
def test_max_num_seqs_stays(config, kw, why):
    assert seqs_fold(config, **kw) == {}, why


def test_v1_on_a_pre_ampere_gpu_folds():
    assert set(fold(vllm_version="0.10.2", hardware={"gpu": "T4"})) == {"enable_prefix_caching", "max_model_len"}


@pytest.mark.parametrize("missing", ["workload_longest_tokens", "workload_shares_prefixes"])
def test_a_study_without_the_workload_facts_folds_that_rule_nothing(missing):
    run = {k: v for k, v in RUN.items() if k != missing}
    folded = no_effect(CONFIG, run, started=True, server=QUIET)
    assert ("max_model_len" in folded) == (missing != "workload_longest_tokens")
    assert ("enable_prefix_caching" in folded) == (missing != "workload_shares_prefixes")


@pytest.mark.parametrize("run", [
    {k: v for k, v in RUN.items() if k != "vllm_version"},
    {k: v for k, v in RUN.items() if k != "hardware"},
    {k: v for k, v in RUN.items() if k != "backend"},
    {**RUN, "vllm_version": "sim"},
    {**RUN, "hardware": {"gpu": "no-such-gpu"}},
    {},
])
def test_unknown_engine_or_backend_folds_nothing(run):
    assert no_effect(CONFIG, run, started=True, server=QUIET) == {}
    assert effective_config(CONFIG, run, started=True, server=QUIET) == CONFIG


def test_an_endpoint_study_folds_nothing_and_says_why():
    run = {**RUN, "backend": "endpoint"}
    assert no_effect(CONFIG, run, started=True, server=QUIET) == {}
    assert "endpoint" in caveat(run) and "applied none" in caveat(run)
    assert caveat(RUN) is None and caveat({}) is None


def gmu_fold(*, server=None, failing=21, started=True, **run):
    """The gpu_memory_utilization rule alone: V1, no shared prefixes, the cache at 3 % unless ``server`` says."""
    folded = no_effect(CONFIG, {**RUN, "load_kind": "concurrency", **run}, started=started,
                       server={"num_preemptions": 0, "kv_cache_usage_max": 0.03} if server is None else server,
                       levels=[30, 21, 15], failing=failing)
    return {k: v for k, v in folded.items() if k == "gpu_memory_utilization"}


def test_memory_utilization_folds_when_the_kv_cache_never_came_near_full():
    assert gmu_fold() == {"gpu_memory_utilization": "the KV cache peaked at 3% of its blocks, no preemption"}
    assert gmu_fold(server={"num_preemptions": 0, "kv_cache_usage_max": 0.25}) != {}  # the limit itself
    assert gmu_fold(failing=None) != {}  # stopped at max-num-seqs, a quarter of the cache unused
    # two trials that differ in it (and in a max-num-seqs never reached) are one configuration
    facts = {"run": {**RUN, "load_kind": "concurrency"}, "started": True, "levels": [30, 21, 15], "failing": 21}
    a = group_key({**CONFIG, "gpu_memory_utilization": 0.85}, server={"num_preemptions": 0, "kv_cache_usage_max": 0.04},
                  **facts)
    b = group_key({**CONFIG, "gpu_memory_utilization": 0.95, "max_num_seqs": 128},
                  server={"num_preemptions": 0, "kv_cache_usage_max": 0.03}, **facts)
    assert a == b


@pytest.mark.parametrize(("kw", "why"), [
    ({"server": {"num_preemptions": 0, "kv_cache_usage_max": 0.26}}, "a quarter full: a few more users could fill it"),
    ({"server": {"num_preemptions": 2, "kv_cache_usage_max": 0.03}}, "preempted: blocks ran out at some moment"),
    ({"server": {"num_preemptions": 0}}, "usage not read (a server without the gauge)"),
    ({"server": {}}, "no readings"),
    ({"workload_shares_prefixes": True}, "freed blocks keep shared prefixes: more memory, more hits"),
    ({"started": False}, "vLLM never started with it: the share decides whether it starts"),
    ({"vllm_version": "0.7.3"}, "V0: only max_num_seqs is folded"),
])
def test_memory_utilization_stays(kw, why):
    assert gmu_fold(**kw) == {}, why


def test_block_size_folds_where_the_kv_cache_never_came_near_full():
    quiet = {"num_preemptions": 0, "kv_cache_usage_max": 0.03}
    facts = {"run": {**RUN, "load_kind": "concurrency"}, "started": True, "levels": [30, 21, 15], "failing": 21}
    assert "block_size" in no_effect({**CONFIG, "block_size": 32}, facts["run"], started=True, server=quiet)
    a = group_key({**CONFIG, "block_size": 16}, server=quiet, **facts)
    assert a == group_key({**CONFIG, "block_size": 32}, server={"num_preemptions": 0, "kv_cache_usage_max": 0.02},
                          **facts)
    # a cache that filled, a preemption, shared prefixes to hash, or a start that never happened: it stays
    for server, run, started in (({"num_preemptions": 0, "kv_cache_usage_max": 0.6}, {}, True),
                                 ({"num_preemptions": 3, "kv_cache_usage_max": 0.03}, {}, True),
                                 (quiet, {"workload_shares_prefixes": True}, True), (quiet, {}, False)):
        assert "block_size" not in no_effect({**CONFIG, "block_size": 32}, {**facts["run"], **run}, started=started,
                                             server=server)


def test_folding_goes_by_the_recorded_capability_not_the_backends_name():
    quiet = {"num_preemptions": 0, "kv_cache_usage_max": 0.03}
    mine = {**RUN, "backend": "my-cluster", "restarts": True}  # a backend written to the protocol
    assert no_effect(CONFIG, mine, started=True, server=quiet) == no_effect(CONFIG, RUN, started=True, server=quiet)
    assert no_effect(CONFIG, mine, started=True, server=quiet) != {}
    attached = {**RUN, "backend": "sim", "restarts": False}  # whatever its name, it applied nothing
    assert no_effect(CONFIG, attached, started=True, server=quiet) == {}
    assert "applied none" in caveat(attached) and caveat(mine) is None

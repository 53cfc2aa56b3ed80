from __future__ import annotations

import math

import pytest

from tuner.core.errors import InputError
from tuner.replay.metrics import MetricsPoller, parse_prometheus, snapshot
from tuner.runtime.routing import Router

# Two DP engines, in the format vLLM 0.33 exports (v1/metrics/loggers.py names).
TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="4096"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
"""


def test_prometheus_text_is_read_with_labels():
    m = parse_prometheus(TEXT)
    assert m["vllm:num_requests_running"][1] == ({"engine": "1", "model_name": "m"}, 4.0)
    assert m["vllm:time_to_first_token_seconds_bucket"][0][0]["le"] == "0.001"


def test_snapshot_sums_engines_and_takes_worst_kv_usage():
    s = snapshot(parse_prometheus(TEXT))
    assert s["running"] == 7 and s["waiting"] == 1
    assert s["kv_usage"] == 0.5  # the fuller engine, not the sum
    assert s["num_gpu_blocks"] == 4096


def test_summary_reports_counter_deltas_not_totals():
    p = MetricsPoller(["http://a", "http://b"])
    p.samples = [
        [{"running": 1, "kv_usage": 0.1, "preemptions": 5, "prefix_queries": 100, "prefix_hits": 10},
         {"running": 2, "kv_usage": 0.3, "preemptions": 0, "prefix_queries": 0, "prefix_hits": 0}],
        [{"running": 5, "kv_usage": 0.6, "preemptions": 7, "prefix_queries": 300, "prefix_hits": 110},
         {"running": 0, "kv_usage": 0.2, "preemptions": 1, "prefix_queries": 100, "prefix_hits": 0}],
    ]
    s = p.summary()
    assert s["num_requests_running_max"] == 5  # 5 + 0 > 1 + 2
    assert s["kv_cache_usage_max"] == 0.6
    assert s["num_preemptions"] == 3  # (7-5) + (1-0)
    assert s["prefix_cache_hit_rate"] == pytest.approx(100 / 300)


def test_hit_rate_is_nan_without_queries():
    p = MetricsPoller(["http://a"])
    p.samples = [[{"prefix_queries": 5, "prefix_hits": 0}], [{"prefix_queries": 5, "prefix_hits": 0}]]
    assert math.isnan(p.summary()["prefix_cache_hit_rate"])


def test_round_robin_cycles_and_least_outstanding_fills_the_idle_replica():
    rr = Router(3, "round_robin")
    assert [rr.pick() for _ in range(5)] == [0, 1, 2, 0, 1]
    lo = Router(2, "least_outstanding")
    assert [lo.pick() for _ in range(3)] == [0, 1, 0]
    lo.done(0)
    lo.done(0)
    assert lo.pick() == 0 and lo.pick() == 0 and lo.pick() == 1


def test_unknown_router_is_bad_input():
    with pytest.raises(InputError, match="least_outstanding"):
        Router(2, "random")

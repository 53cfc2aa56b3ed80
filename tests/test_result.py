"""RunResult's summary and its vllm bench serve names (tuner.serving.result.bench_fields), on a
run small enough to work out by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.serving.load import Concurrency, Poisson, TraceReplay
from tuner.serving.result import BENCH_FIELDS, RunResult, bench_fields


def _run(**extra) -> RunResult:
    """Four requests over 2 s: TTFT 0.1-0.4 s, each 100 prompt + 11 output tokens ending
    1 s after its first token (TPOT 0.1 s), and a failed fifth that counts for nothing."""
    nan = math.nan
    return RunResult(
        send_s=np.array([0.0, 0.0, 0.5, 0.5, 1.0]), ttft_s=np.array([0.1, 0.2, 0.3, 0.4, nan]),
        e2e_s=np.array([1.1, 1.2, 1.3, 1.4, nan]), prompt_tokens=np.array([100, 100, 100, 100, 100]),
        output_tokens=np.array([11, 11, 11, 11, 0]), error=[None, None, None, None, "timeout"],
        duration_s=2.0, **extra)


def test_the_hand_worked_run_in_vllm_bench_names_and_milliseconds():
    got = bench_fields(_run(itl_s=np.array([0.01, 0.03])).summary(), Concurrency(3))
    assert list(got) == list(BENCH_FIELDS)
    assert got["completed"] == 4 and got["duration"] == 2.0
    assert got["request_throughput"] == pytest.approx(2.0)          # 4 good requests / 2 s
    assert got["output_throughput"] == pytest.approx(22.0)          # 44 output tokens / 2 s
    assert got["total_token_throughput"] == pytest.approx(222.0)    # (400 + 44) / 2 s
    assert got["mean_ttft_ms"] == pytest.approx(250.0) and got["median_ttft_ms"] == pytest.approx(250.0)
    assert got["std_ttft_ms"] == pytest.approx(math.sqrt(12_500))   # deviations 150, 50, 50, 150 ms
    assert got["p99_ttft_ms"] == pytest.approx(397.0)               # numpy's linear percentile, as vllm's
    assert got["mean_tpot_ms"] == pytest.approx(100.0) and got["std_tpot_ms"] == pytest.approx(0.0, abs=1e-9)
    assert got["mean_e2el_ms"] == pytest.approx(1250.0)
    assert got["mean_itl_ms"] == pytest.approx(20.0) and got["std_itl_ms"] == pytest.approx(10.0)
    assert got["max_concurrency"] == 3.0 and got["request_rate"] is None


def test_the_load_is_a_number_from_the_load_or_its_label():
    summary = _run().summary()
    assert bench_fields(summary, "264 users")["max_concurrency"] == 264.0
    assert bench_fields(summary, "2.5 req/s")["request_rate"] == 2.5
    assert bench_fields(summary, Poisson(4.0))["request_rate"] == 4.0
    for load in (TraceReplay(2.0), "trace x2", None, "not a load"):
        got = bench_fields(summary, load)
        assert got["max_concurrency"] is None and got["request_rate"] is None


def test_what_was_not_measured_is_none_not_made_up():
    got = bench_fields(_run().summary(), "4 users")  # no per-token times: no ITL
    assert all(got[f"{s}_itl_ms"] is None for s in ("mean", "median", "std", "p90", "p95", "p99"))
    old = {k: v for k, v in _run().summary().items() if "_std_" not in k}  # a trial stored before std
    assert bench_fields(old)["std_ttft_ms"] is None and bench_fields(old)["mean_ttft_ms"] == pytest.approx(250.0)
    assert bench_fields({})["total_token_throughput"] is None and bench_fields({})["request_goodput"] is None

"""`tuner estimate`: exit codes, the JSON keys other tools read, and the seed-000 story."""
from __future__ import annotations

import json

import pytest

from tuner.cli import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", *args])
        raise SystemExit(0)
    out = capsys.readouterr()
    return exit_info.value.code or 0, out.out, out.err


def test_plan_is_printed_with_vllms_log_line(capsys):
    code, out, _ = run(capsys, "--gpu", "H200", "--model", "qwen2.5-7b", "--max-model-len", "4096",
                       "--gpu-memory-utilization", "0.9")
    assert code == 0
    assert "GPU KV cache size:" in out and "Maximum concurrency for 4,096 tokens per request" in out
    assert "weights" in out and "CUDA graphs" in out


def test_json_memory_keys(capsys):
    code, out, _ = run(capsys, "--gpu", "h100", "--model", "llama-3.1-8b", "--max-model-len", "8192",
                       "--output", "json")
    data = json.loads(out)
    assert code == 0 and data["load"] == []
    memory = data["memory"]
    assert memory["error"] is None
    assert memory["num_gpu_blocks"] > 0 and memory["kv_cache_tokens"] > 0
    assert memory["max_concurrency"] == pytest.approx(memory["num_gpu_blocks"] / (8192 / 16))


def test_refusal_prints_vllms_message_and_exits_1(capsys):
    code, out, _ = run(capsys, "--gpu", "V100-16GB-PCIE", "--model", "gemma-2-27b", "--dtype",
                       "bfloat16", "--max-model-len", "8192", "-o", "json")
    assert code == 1
    memory = json.loads(out)["memory"]
    assert memory["error"].startswith("Bfloat16 is only supported on GPUs with compute capability")
    assert memory["error_kind"] == "dtype"


def test_weights_that_fill_the_budget_show_the_arithmetic_with_the_refusal(capsys):
    # 16 GB of fp16 Llama-3.1-8B weights on a 16 GB V100: vLLM loads them, profiles, and finds
    # nothing left for the cache; estimate shows why in bytes.
    code, out, _ = run(capsys, "--gpu", "v100-16gb", "--model", "llama-3.1-8b", "--dtype", "float16",
                       "--max-model-len", "8192", "--gpu-memory-utilization", "0.92",
                       "--enforce-eager", "--vllm-version", "0.6.3", "-o", "json")
    memory = json.loads(out)["memory"]
    assert code == 1 and memory["error_kind"] == "no_kv_memory"
    assert memory["weight_bytes"] > memory["budget_bytes"] * 0.95
    assert memory["kv_bytes"] < 0


def test_gemma2_on_volta_is_refused_for_soft_capping_before_memory(capsys):
    # Volta has no FlashAttention, so vLLM 0.6 picks XFormers, which refuses Gemma-2's logit soft
    # capping when the model is built: before any memory is profiled.
    code, out, _ = run(capsys, "--gpu", "v100-16gb", "--model", "gemma-2-27b-gptq", "--max-model-len",
                       "8192", "--gpu-memory-utilization", "0.92", "--enforce-eager",
                       "--vllm-version", "0.6.3", "-o", "json")
    memory = json.loads(out)["memory"]
    assert code == 1 and memory["error_kind"] == "attention"
    assert "soft capping" in memory["error"] and memory["num_gpu_blocks"] is None


def test_bad_input_exits_2(capsys):
    code, _, err = run(capsys, "--gpu", "B999")
    assert code == 2 and "unknown GPU" in err
    code, _, err = run(capsys, "--concurrency", "5,x")
    assert code == 2 and "--concurrency" in err


def test_load_table_json_keys(capsys):
    pytest.importorskip("tuner.sim.engine")
    code, out, _ = run(capsys, "--gpu", "h100", "--model", "qwen2.5-7b", "--max-model-len", "4096",
                       "--concurrency", "1,8", "--input-len", "512", "--output-len", "64",
                       "--num-requests", "40", "-o", "json")
    rows = json.loads(out)["load"]
    assert code == 0 and [r["concurrency"] for r in rows] == [1, 8]
    for row in rows:
        assert set(row) >= {"ttft_mean_s", "ttft_p95_s", "tpot_mean_s", "tokens_per_s",
                            "output_tokens_per_s", "requests_per_s"}
        assert row["tokens_per_s"] == pytest.approx(row["requests_per_s"] * (512 + 64), rel=0.01)
    # More users in flight: more throughput, no faster first token.
    assert rows[1]["tokens_per_s"] > rows[0]["tokens_per_s"]
    assert rows[1]["ttft_mean_s"] >= rows[0]["ttft_mean_s"]


def test_load_rows_carry_vllm_bench_names_and_pandas_reads_them(capsys):
    pytest.importorskip("tuner.sim.engine")
    import pandas as pd

    code, out, _ = run(capsys, "--gpu", "h100", "--model", "qwen2.5-7b", "--max-model-len", "4096",
                       "--concurrency", "4", "--rate", "2", "--input-len", "512", "--output-len", "64",
                       "--num-requests", "40", "-o", "json")
    rows = pd.json_normalize(json.loads(out), "load")
    assert code == 0 and len(rows) == 2
    closed, poisson = rows.iloc[0], rows.iloc[1]
    assert closed["max_concurrency"] == 4 and pd.isna(closed["request_rate"])
    assert poisson["request_rate"] == 2 and pd.isna(poisson["max_concurrency"])
    for _, row in rows.iterrows():  # 40 requests of 512 + 64 tokens, all served
        assert row["completed"] == 40
        assert row["total_token_throughput"] == pytest.approx(row["request_throughput"] * 576)
        assert row["output_throughput"] == pytest.approx(row["request_throughput"] * 64)
        assert row["mean_ttft_ms"] == pytest.approx(row["ttft_mean_s"] * 1e3)
        assert row["p95_ttft_ms"] == pytest.approx(row["ttft_p95_s"] * 1e3)
        assert row["mean_tpot_ms"] == pytest.approx(row["tpot_mean_s"] * 1e3)
        assert row["median_e2el_ms"] > row["median_ttft_ms"] and row["std_ttft_ms"] >= 0


def test_rate_table(capsys):
    pytest.importorskip("tuner.sim.engine")
    code, out, _ = run(capsys, "--gpu", "h100", "--model", "qwen2.5-7b", "--max-model-len", "4096",
                       "--rate", "2", "--num-requests", "30", "--input-len", "256",
                       "--output-len", "32")
    assert code == 0 and "rate" in out and "TTFT p95" in out


def test_trace_replay_uses_the_first_rows(capsys):
    pytest.importorskip("tuner.sim.engine")
    from trace_data import AZURE_CONV as trace

    code, out, _ = run(capsys, "--gpu", "h100", "--model", "qwen2.5-7b", "--trace", str(trace),
                       "-n", "200", "--rate", "2", "-o", "json")
    rows = json.loads(out)["load"]
    assert code == 0 and rows[0]["rate"] == 2.0
    assert 1.0 < rows[0]["requests_per_s"] < 3.0


def test_set_and_the_knob_flag_describe_the_same_configuration(capsys):
    by_flag = run(capsys, "--gpu", "H200", "--max-num-seqs", "64", "--kv-cache-dtype", "fp8", "-o", "json")
    by_set = run(capsys, "--gpu", "H200", "--set", "max_num_seqs=64", "--set", "kv_cache_dtype=fp8", "-o", "json")
    default = run(capsys, "--gpu", "H200", "-o", "json")
    assert by_flag[0] == by_set[0] == 0 and json.loads(by_flag[1]) == json.loads(by_set[1])
    assert json.loads(by_flag[1])["memory"] != json.loads(default[1])["memory"]
    code, _, err = run(capsys, "--set", "block_size=7.5")
    assert code == 2 and "--set block_size=7.5: block_size takes int values" in err

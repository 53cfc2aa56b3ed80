"""Step time: a hand-computed roofline kernel class by kernel class, the embeddings and LM head,
launch modes, TP all-reduce, MoE experts and their tile padding, the run formula."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from tuner.sim.calibration import Calibration, load_calibration
from tuner.sim.hardware import get_gpu
from tuner.sim.steptime import StepTimer

CAL = Calibration(
    gpu_class="test", hbm_efficiency=0.5, flops_efficiency=0.5, step_overhead_s=0.001,
    per_seq_overhead_s=0.0, launch_per_layer_s={"graph": 0.0, "piecewise": 0.0001, "compiled": 0.0002,
                                                "eager": 0.001},
    allreduce_latency_s=0.00001, link_efficiency=0.5,
)


class Model:
    """1e9 parameters per token of which an 8e6-parameter vocabulary table, tied (the LM
    head reads it); 10 layers of 8 heads of 100 (hidden 800)."""

    num_layers = 10
    num_heads = 8
    head_dim = 100
    hidden_size = 800
    vocab_size = 10_000
    tie_word_embeddings = True
    is_moe = False
    num_experts = 0
    num_experts_per_tok = 0

    def kv_bytes_per_token(self, tp: int, kv_bytes: int) -> int:
        return 100_000 // tp

    def active_param_count(self) -> int:
        return 1_000_000_000

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def active_expert_params(self) -> int:
        return 0

    def expert_bytes(self, quantization=None) -> int:
        return 0


class Untied(Model):
    """The same with a separate LM head: the input table (8e6 parameters, 16 MB) is only
    looked up."""

    tie_word_embeddings = False


class MoE(Model):
    """1e9 active parameters of which 6e8 in experts (2 of 8 a token, 3e8 a pass); 2e9 bytes
    of weights of which 1.6e9 are the 8 experts' (2e8 each)."""

    is_moe = True
    num_experts = 8
    num_experts_per_tok = 2

    def active_expert_params(self) -> int:
        return 600_000_000

    def expert_bytes(self, quantization=None) -> int:
        return 1_600_000_000


def plan(tp: int = 1, eager: bool = False, max_num_seqs: int = 256, model=None) -> SimpleNamespace:
    gpu = SimpleNamespace(hbm_bandwidth=1e12, fp16_flops=1e14, link_bandwidth=1e11)
    config = SimpleNamespace(tensor_parallel_size=tp, enforce_eager=eager, max_num_seqs=max_num_seqs)
    return SimpleNamespace(gpu=gpu, model=model or Model(), config=config, weight_bytes=2_000_000_000 // tp,
                           kv_cache_dtype_bytes=2, quantization=None)


def test_hand_computed_mixed_batch() -> None:
    # One 1000-token prefill from scratch plus 10 decodes at 999 computed tokens each.
    # matmuls: 2e9 B of weights at 5e11 B/s = 4 ms; FLOPs 2 x (1e9 - 8e6) x 1010 tokens
    #   + the LM head at 11 positions, 2 x 8e6 x 11 = 2.004016e12 at 5e13 -> 40.08032 ms (compute)
    # attention: KV 1e5 x (1000 + 10 x 1000) = 1.1e9 B -> 2.2 ms; 32,000 FLOPs a pair x
    #   (1000 x 500.5 + 10 x 1000) pairs = 1.6336e10 -> 0.32672 ms: the KV read, 2.2 ms,
    #   after the matmuls (the decodes' attention is not hidden under the prefill's GEMMs)
    # launch: 1010 tokens > capture size 512 -> "compiled", 10 x 0.2 ms = 2 ms (hidden)
    # + 1 ms fixed overhead = 43.28032 ms
    t = StepTimer(plan(), CAL)
    assert t.mode(1010, 11, False) == "compiled"
    dur = t.step(1010, 11, False, ctx_tokens=1000 + 10 * 1000, attn_pairs=1000 * 500.5 + 10 * 1000)
    assert dur == pytest.approx(0.04328032, rel=1e-9)


def test_the_input_embedding_is_looked_up_not_read() -> None:
    # a decode step of one token reads the weights but the untied input table (16 MB):
    # (2e9 - 1.6e7) B at 5e11 B/s = 3.968 ms, + KV 1e7 B = 0.02 ms, + 1 ms fixed
    untied = StepTimer(plan(model=Untied()), CAL)
    assert untied.step(1, 1, True, 100, 100) == pytest.approx(0.003968 + 0.00002 + 0.001, rel=1e-9)
    # tied, the LM head reads the same table: all 2e9 B
    assert StepTimer(plan(), CAL).step(1, 1, True, 100, 100) == pytest.approx(0.004 + 0.00002 + 0.001, rel=1e-9)


def test_the_lm_head_runs_once_per_request_not_per_token() -> None:
    # 4096 prompt tokens of one request cost less than 4096 one-token requests by 4095 LM-head
    # passes: 4095 x 2 x 8e6 FLOPs at 5e13 = 1.3104 ms (both compute-bound; attention aside)
    t = StepTimer(plan(), CAL)
    one = t.matmul_time(4096, 1)
    many = t.matmul_time(4096, 4096)
    assert many - one == pytest.approx(4095 * 2 * 8e6 / 5e13, rel=1e-9)


def test_launch_modes_follow_cuda_graph_rules() -> None:
    t = StepTimer(plan(max_num_seqs=4), CAL)          # capture size min(2 x 4, 512) = 8
    assert t.mode(8, 8, True) == "graph"
    assert t.mode(9, 9, True) == "compiled"            # beyond the capture size: no graph at all
    assert t.mode(6, 3, False) == "piecewise"
    assert t.mode(100, 3, False) == "compiled"
    assert StepTimer(plan(eager=True), CAL).mode(1, 1, True) == "eager"
    small = dict(num_tokens=1, num_seqs=1, decode_only=True, ctx_tokens=100, attn_pairs=100)
    eager = StepTimer(plan(eager=True), CAL).step(**small)
    graph = StepTimer(plan(), CAL).step(**small)
    # eager: 10 layers x 1 ms of launches hides the 4 ms weight read
    assert eager == pytest.approx(0.010 + 0.001) and graph < eager


def test_tensor_parallel_adds_all_reduce_but_splits_weights() -> None:
    one = StepTimer(plan(tp=1), CAL)
    two = StepTimer(plan(tp=2), CAL)
    d1 = one.step(1, 1, True, 100, 100)
    d2 = two.step(1, 1, True, 100, 100)
    # 20 all-reduces x (10 us + 2 x 1/2 x 800 x 2 B / 5e10 B/s)
    ar = 20 * (1e-5 + 800 * 2 / 5e10)
    assert d2 == pytest.approx((d1 - 0.001) / 2 + 0.001 + ar, rel=1e-6)


def test_an_moe_decode_reads_only_the_experts_its_tokens_use() -> None:
    # one token: 2 of 8 experts -> 0.4e9 dense + 1.6e9 x 2/8 = 0.8e9 B at 5e11 B/s = 1.6 ms (+ 1 ms fixed);
    # 4 tokens: 1 - (6/8)^4 = 68.36 % of the experts: 0.4e9 + 1.09375e9 B = 2.9875 ms (+ 1 ms)
    moe = StepTimer(plan(model=MoE()), CAL)
    assert moe.step(1, 1, True, 0, 0) == pytest.approx(0.0016 + 0.001, rel=1e-9)
    assert moe.step(4, 4, True, 0, 0) == pytest.approx(0.0029875 + 0.001, rel=1e-9)
    # 64 tokens touch every expert: all 1.6e9 B of them, 3.2 ms, beside the dense part
    dense_part = max(0.0008, 2 * (1e9 - 8e6 - 6e8) * 64 / 5e13 + 2 * 8e6 * 64 / 5e13)
    assert moe.matmul_time(64, 64) == pytest.approx(dense_part + 0.0032, rel=1e-6)


def test_the_fused_moe_kernel_pads_each_experts_rows_to_its_tile() -> None:
    from tuner.sim.steptime import moe_block_size_m, padded_expert_rows

    # vLLM's tuned H200 table for E=128,N=768 (fused_moe/configs/E=128,N=768,device_name=
    # NVIDIA_H200.json): BLOCK_SIZE_M 16 up to 128 tokens, 32 at 256, 64 at 512, 128 from 1024
    assert [moe_block_size_m(m, 8, 128) for m in (1, 64, 128, 256, 512, 1024, 2048, 4096)] == \
        [16, 16, 16, 32, 64, 128, 128, 128]
    # 1024 tokens x 8 experts = 8192 pairs, ~64 an expert, each expert padded to one 128-row
    # tile: twice the rows
    assert padded_expert_rows(1024, 8, 128) == pytest.approx(128 * 128, rel=1e-3)
    # never fewer rows than pairs; the padding's share shrinks as batches grow
    shares = [padded_expert_rows(t, 8, 128) / (8 * t) for t in (1024, 2048, 4096, 8192, 32768)]
    assert all(s >= 1.0 for s in shares) and shares == sorted(shares, reverse=True) and shares[-1] < 1.05
    # one token touches k experts, each padded to a 16-row tile (Poisson routing: ~k experts)
    assert padded_expert_rows(1, 2, 8) == pytest.approx(8 * 16 * (1 - math.exp(-0.25)), rel=1e-9)


def test_moe_expert_flops_run_at_their_own_efficiency() -> None:
    # a large prefill: the expert GEMMs (their padded rows) at half the dense efficiency take
    # twice as long as at the dense efficiency
    from tuner.sim.steptime import padded_expert_rows

    slow = StepTimer(plan(model=MoE()), CAL.replace(moe_flops_efficiency=0.5))
    fast = StepTimer(plan(model=MoE()), CAL)
    rows = padded_expert_rows(100_000, 2, 8)
    assert slow.s_expert_flops * rows == pytest.approx(2 * fast.s_expert_flops * rows, rel=1e-12)
    assert fast.s_expert_flops == pytest.approx(2 * 3e8 / 5e13, rel=1e-12)   # one token, one expert pass
    t = 100_000
    dense = 2 * (1e9 - 8e6 - 6e8) * t / 5e13 + 2 * 8e6 / 5e13
    assert slow.matmul_time(t, 1) == pytest.approx(dense + slow.s_expert_flops * rows, rel=1e-9)


def test_an_moe_layer_costs_its_fixed_time_and_the_experts_stream_at_their_own_efficiency() -> None:
    # 10 MoE layers x 30 us = 0.3 ms on every step; the experts' bytes at 0.8 of the 1e12 B/s
    # peak instead of the dense 0.5: one token reads 0.4e9 B dense at 5e11 (0.8 ms) and
    # 0.4e9 B of experts at 8e11 (0.5 ms): 1.3 ms + 0.3 ms + the 1 ms fixed step overhead
    cal = CAL.replace(moe_layer_s=30e-6, moe_hbm_efficiency=0.8)
    moe = StepTimer(plan(model=MoE()), cal)
    assert moe.step(1, 1, True, 0, 0) == pytest.approx(0.0008 + 0.0005 + 0.0003 + 0.001, rel=1e-9)
    # 64 tokens read every expert: 1.6e9 B at 8e11 = 2 ms, under the experts' FLOPs now (their
    # padded rows at 1.2e-5 s a row, 3.07 ms), which bind; plus the same 0.3 ms
    dense_part = max(0.0008, 2 * (1e9 - 8e6 - 6e8) * 64 / 5e13 + 2 * 8e6 * 64 / 5e13)
    flops = moe.s_expert_flops * moe.expert_rows(64)
    assert moe.s_experts == pytest.approx(0.002, rel=1e-12) and flops > 0.003
    assert moe.matmul_time(64, 64) == pytest.approx(dense_part + flops + 0.0003, rel=1e-6)
    # the fixed time is the same at every batch, so it weighs most where the experts' bytes are
    # fewest (one user: 0.3 of 2.6 ms here, 64 tokens: 0.3 of 5.4 ms), and a dense model pays none of it
    base = StepTimer(plan(model=MoE()), CAL.replace(moe_hbm_efficiency=0.8))
    assert [moe.step(n, n, True, 0, 0) - base.step(n, n, True, 0, 0) for n in (1, 4, 64)] == \
        pytest.approx([0.0003] * 3, rel=1e-9)
    assert StepTimer(plan(), cal).step(4, 4, True, 0, 0) == StepTimer(plan(), CAL).step(4, 4, True, 0, 0)
    # unset, the experts stream at hbm_efficiency, as before
    assert StepTimer(plan(model=MoE()), CAL).s_experts == pytest.approx(1.6e9 / 5e11, rel=1e-12)


def test_decode_run_equals_repeated_steps() -> None:
    for model in (Model(), MoE()):
        t = StepTimer(plan(model=model), CAL.replace(moe_layer_s=20e-6, moe_hbm_efficiency=0.7))
        n, ctx0, k = 37, 37 * 500, 200
        run = t.decode_run(n, ctx0, k)
        one_by_one = [t.step(n, n, True, ctx0 + n * (s + 1), ctx0 + n * (s + 1)) for s in range(k)]
        np.testing.assert_allclose(run, one_by_one, rtol=1e-12)


def test_shipped_tables_name_their_sources() -> None:
    for gpu in ("H200", "H100-SXM", "V100-32GB-SXM2", "A100-80GB", "T4", "L4"):
        cal = load_calibration(get_gpu(gpu))
        for key in ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "launch_per_layer_s"):
            assert cal.sources.get(key), (gpu, key)


def test_profile_overrides_some_constants_and_keeps_the_rest(tmp_path) -> None:
    prof = tmp_path / "h200.yaml"
    prof.write_text("step_overhead_s:\n  value: 0.002\n  source: measured\n"
                    "launch_per_layer_s:\n  value: {eager: 0.001}\n"
                    "memory:\n  activation_factor: 1.1\nmatch: {gpu: H200}\n")
    base = load_calibration(get_gpu("H200"))
    cal = load_calibration(get_gpu("H200"), str(prof))
    assert cal.step_overhead_s == 0.002 and cal.sources["step_overhead_s"] == "measured"
    assert cal.hbm_efficiency == base.hbm_efficiency
    assert cal.launch_per_layer_s["eager"] == 0.001
    assert cal.launch_per_layer_s["graph"] == base.launch_per_layer_s["graph"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("hbm_eficiency: 0.9\n")
    from tuner.core.errors import InputError
    with pytest.raises(InputError, match="hbm_eficiency"):
        load_calibration(get_gpu("H200"), str(bad))

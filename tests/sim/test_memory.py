"""The memory planner against real vLLM 0.26.0 logs on an H200, vLLM's own refusal
messages, invariants, and the seed-000 article's arithmetic."""
from __future__ import annotations

import re

import pytest

from tuner.core.errors import ConfigRejected
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.hardware import GiB
from tuner.sim.memory import plan_memory

H200_7B = Deployment(model="qwen2.5-7b", gpu="H200", vllm_version="0.26.0", dtype="bfloat16")


def rejected(deployment, config) -> ConfigRejected:
    with pytest.raises(ConfigRejected) as err:
        plan_memory(deployment, config)
    return err.value


# --------------------------------------------------------------- real H200 anchors
def test_h200_kv_cache_size_matches_vllm_026_log():
    # vLLM 0.26.0 printed "GPU KV cache size: 2,064,240 tokens" (gmu 0.9, max-model-len 4096,
    # CUDA graphs on) and "Model loading took 14.29 GiB".
    plan = plan_memory(H200_7B, ServeConfig(gpu_memory_utilization=0.9, max_model_len=4096))
    assert plan.kv_cache_tokens == pytest.approx(2_064_240, rel=0.03)
    assert plan.weight_bytes / GiB == pytest.approx(14.29, rel=0.03)
    assert plan.cudagraph_bytes / GiB == pytest.approx(0.54, rel=0.03)
    line = next(s for s in plan.log_lines() if s.startswith("GPU KV cache size"))
    assert re.fullmatch(r"GPU KV cache size: [\d,]+ tokens, Maximum concurrency for 4,096 tokens "
                        r"per request: [\d.]+x", line)


def test_h200_max_model_len_refusal_matches_vllm_026_log():
    # gmu 0.12, max-model-len 32768: "(1.75 GiB KV cache is needed, which is larger than the
    # available KV cache memory (1.14 GiB). ... the estimated maximum model length is 21408."
    err = rejected(H200_7B, ServeConfig(gpu_memory_utilization=0.12, max_model_len=32768))
    assert err.kind == "max_model_len"
    assert err.message.startswith(
        "To serve at least one request with the model's max seq len (32768), (1.75 GiB KV cache "
        "is needed, which is larger than the available KV cache memory (")
    available = float(re.search(r"available KV cache memory \(([\d.]+) GiB\)", err.message)[1])
    assert available == pytest.approx(1.14, rel=0.03)
    assert err.estimated_max_model_len == pytest.approx(21408, rel=0.01)
    assert f"estimated maximum model length is {err.estimated_max_model_len}." in err.message


@pytest.mark.parametrize("gmu, logged", [(0.12, 21408), (0.115, 8320)])
def test_eager_refusal_worked_by_hand_from_vllms_own_memory_lines(gmu, logged):
    # The eager start at 8192 batched tokens logged "14.29 GiB for weight, 1.12 GiB for peak
    # activation, 0.22 GiB for non-torch memory, and 0.0 GiB for CUDAGraph memory" (twice).
    # By hand at gmu 0.115: ceil(139.80 GiB x 0.115) = 16.077 GiB; less 14.29 + 1.12 + 0.22
    # leaves 0.447 GiB = 523 blocks of 917,504 B (28 layers x 2 x 4 heads x 128 x 2 B x 16),
    # 8,368 tokens; vLLM said 0.44 GiB and 8320 (520 blocks): the logged GiB are rounded.
    cfg = ServeConfig(gpu_memory_utilization=gmu, max_model_len=32768, enforce_eager=True)
    plan = plan_memory(H200_7B, cfg, strict=False)
    assert plan.weight_bytes / GiB == pytest.approx(14.29, abs=0.005)
    assert plan.activation_bytes / GiB == pytest.approx(1.12, abs=0.005)
    assert plan.non_torch_bytes / GiB == pytest.approx(0.22, abs=0.005)
    by_hand = (plan.budget_bytes - (14.29 + 1.12 + 0.22) * GiB) // (16 * 57344) * 16
    assert plan.error.estimated_max_model_len == pytest.approx(by_hand, abs=16 * 8)
    assert plan.error.estimated_max_model_len == pytest.approx(logged, rel=0.01)


def test_eager_and_compiled_profile_runs_peak_apart_only_where_a_profile_says():
    eager = ServeConfig(gpu_memory_utilization=0.9, enforce_eager=True, max_num_batched_tokens=2048)
    graphs = eager.replace(enforce_eager=False)
    no_profile = Deployment(model="qwen2.5-7b", gpu="A100-80GB", vllm_version="0.26.0")
    # the class tables carry no eager figure: one slope for both (graphs then at least as big:
    # compiled, the peak follows the default batched tokens)
    a, b = (plan_memory(no_profile, c).activation_bytes for c in (eager, graphs))
    assert a <= b
    # more batched tokens, more peak activation, in both modes
    for c in (eager, graphs):
        small = plan_memory(H200_7B, c.replace(max_num_batched_tokens=1024)).activation_bytes
        assert small <= plan_memory(H200_7B, c.replace(max_num_batched_tokens=4096)).activation_bytes


# --------------------------------------------------------------- invariants
def test_more_memory_utilization_gives_more_blocks():
    blocks = [plan_memory(H200_7B, ServeConfig(gpu_memory_utilization=g)).num_gpu_blocks
              for g in (0.3, 0.5, 0.7, 0.9, 0.95)]
    assert blocks == sorted(blocks) and len(set(blocks)) == len(blocks)


def test_eager_frees_graph_memory_and_fp8_kv_doubles_blocks():
    base = plan_memory(H200_7B, ServeConfig(gpu_memory_utilization=0.9))
    eager = plan_memory(H200_7B, ServeConfig(gpu_memory_utilization=0.9, enforce_eager=True))
    fp8 = plan_memory(H200_7B, ServeConfig(gpu_memory_utilization=0.9, kv_cache_dtype="fp8"))
    # vLLM 0.26.0 on the H200 logs its graph memory but leaves it in the KV budget, so eager
    # and graphs differ only by their profile runs' peaks (eager 128,951 blocks vs graphs 128,943
    # and 129,015; tuner/data/calibration/h200-vllm-0.26.0): within 0.05 %
    assert eager.cudagraph_bytes == 0
    assert eager.num_gpu_blocks == pytest.approx(base.num_gpu_blocks, rel=5e-4)
    assert fp8.page_bytes * 2 == base.page_bytes
    assert fp8.num_gpu_blocks in (2 * base.num_gpu_blocks, 2 * base.num_gpu_blocks + 1)


def test_tp_beyond_kv_heads_replicates_kv_heads():
    d = Deployment(model="qwen2.5-7b", gpu="H100-SXM", gpu_count=8)  # 4 KV heads
    p4 = plan_memory(d, ServeConfig(tensor_parallel_size=4))
    p2 = plan_memory(d, ServeConfig(tensor_parallel_size=2))
    assert p4.page_bytes * 2 == p2.page_bytes
    d14 = Deployment(model="qwen2.5-14b", gpu="H100-SXM", gpu_count=8)  # 8 KV heads, 40 heads
    p8 = plan_memory(d14, ServeConfig(tensor_parallel_size=8))
    assert p8.page_bytes == 16 * 2 * 48 * 1 * 128 * 2  # one head per rank, 48 layers, K and V


def test_concurrency_is_blocks_over_blocks_per_request():
    plan = plan_memory(H200_7B, ServeConfig(max_model_len=5000, block_size=32))
    per_request = -(-5000 // 32)
    assert plan.max_concurrency * per_request == pytest.approx(plan.num_gpu_blocks)
    assert plan.kv_cache_tokens <= plan.num_gpu_blocks * 32


def test_defaults_follow_the_vllm_version_and_gpu():
    new = plan_memory(H200_7B, ServeConfig())
    assert (new.config.gpu_memory_utilization, new.config.max_num_seqs, new.config.max_num_batched_tokens) == (0.92, 1024, 8192)  # noqa: E501
    assert new.config.max_model_len == 32768 and new.config.block_size == 16
    a100 = plan_memory(Deployment(model="qwen2.5-7b", gpu="A100-80GB"), ServeConfig())
    assert (a100.config.max_num_seqs, a100.config.max_num_batched_tokens) == (256, 2048)
    old = plan_memory(Deployment(model="qwen2.5-7b", gpu="A100-80GB", vllm_version="0.6.3"),
                      ServeConfig(max_model_len=8192))
    assert old.config.gpu_memory_utilization == 0.9 and old.config.max_num_seqs == 256
    assert old.cudagraph_bytes == 0  # graphs were not subtracted before 0.21


# --------------------------------------------------------------- refusals in vLLM's words
def test_no_memory_for_cache_blocks():
    err = rejected(Deployment(model="llama-3.1-8b", gpu="L4"), ServeConfig(gpu_memory_utilization=0.6))
    assert err.kind == "no_kv_memory"
    assert err.message.startswith("No available memory for the cache blocks. Try increasing "
                                  "`gpu_memory_utilization` when initializing the engine")


def test_tp_must_divide_attention_heads():
    d = Deployment(model="qwen2.5-7b", gpu="H100-SXM", gpu_count=8)  # 28 heads
    err = rejected(d, ServeConfig(tensor_parallel_size=8))
    assert err.kind == "tensor_parallel"
    assert err.message == ("Total number of attention heads (28) must be divisible by tensor "
                           "parallel size (8).")


def test_layout_needs_enough_gpus():
    d = Deployment(model="qwen2.5-7b", gpu="H100-SXM", gpu_count=4)
    assert rejected(d, ServeConfig(tensor_parallel_size=2, replicas=3)).kind == "layout"


def test_batch_tokens_below_max_num_seqs():
    err = rejected(H200_7B, ServeConfig(max_num_seqs=512, max_num_batched_tokens=256))
    assert err.kind == "batch_tokens"
    assert err.message == ("max_num_batched_tokens (256) must be greater than or equal to "
                           "max_num_seqs (512).")


def test_block_size_the_backend_rejects():
    assert rejected(H200_7B, ServeConfig(block_size=8)).kind == "block_size"
    assert plan_memory(H200_7B, ServeConfig(block_size=48)).config.block_size == 48


def test_bf16_on_volta_is_refused_and_auto_falls_back_to_fp16():
    d = Deployment(model="qwen2.5-7b", gpu="V100-32GB-SXM2", dtype="bfloat16")
    err = rejected(d, ServeConfig(max_model_len=4096))
    assert err.kind == "dtype"
    assert err.message == (
        "Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla "
        "V100-SXM2-32GB GPU has compute capability 7.0. You can use float16 instead by explicitly "
        "setting the `dtype` flag in CLI, for example: --dtype=half.")
    auto = plan_memory(Deployment(model="qwen2.5-7b", gpu="V100-32GB-SXM2"), ServeConfig(max_model_len=4096))
    assert auto.dtype == "float16"


def test_quantization_below_minimum_capability():
    d = Deployment(model="qwen2.5-7b-awq", gpu="V100-32GB-SXM2")
    err = rejected(d, ServeConfig(max_model_len=4096))
    assert err.kind == "quantization"
    assert err.message == ("The quantization method awq is not supported for the current GPU. "
                           "Minimum capability: 75. Current capability: 70.")
    # T4 (7.5) runs AWQ; Ampere and newer get the Marlin kernel.
    assert plan_memory(Deployment(model="qwen2.5-7b-awq", gpu="T4"),
                       ServeConfig(max_model_len=4096)).quantization == "awq"
    assert plan_memory(Deployment(model="qwen2.5-7b-awq", gpu="A10"),
                       ServeConfig(max_model_len=4096)).quantization == "awq_marlin"


# --------------------------------------------------------------- seed 000 (V100-16GB, ~27B AWQ)
SEED000 = ServeConfig(gpu_memory_utilization=0.92, max_model_len=8192, enforce_eager=True)


def test_seed000_awq_on_v100_is_refused_by_vllm():
    # The article serves "Qwen2.5-27B-Instruct-AWQ" (no such model; gemma-2-27b is the real
    # ~27B) with --quantization awq on a V100. vLLM's AWQ needs compute capability 7.5.
    d = Deployment(model="gemma-2-27b-awq", gpu="V100-16GB-PCIE", vllm_version="0.6.3",
                   quantization="awq")
    assert rejected(d, SEED000).kind == "quantization"
    bf16 = Deployment(model="gemma-2-27b", gpu="V100-16GB-PCIE", vllm_version="0.6.3", dtype="bfloat16")
    assert rejected(bf16, SEED000).kind == "dtype"


def test_seed000_arithmetic_leaves_no_room_for_8k_sequences():
    # GPTQ (min capability 6.0) loads on a V100: the same 4-bit weights, so the same arithmetic.
    # vLLM 0.6.3 would refuse Gemma-2 on Volta earlier, in XFormers (test below); the V1 engine's
    # Triton attention, which Volta runs from 0.10.2, builds it and reaches the memory check.
    d = Deployment(model="gemma-2-27b-gptq", gpu="V100-16GB-PCIE", vllm_version="0.11.0")
    plan = plan_memory(d, SEED000, strict=False)
    weights_gb = plan.weight_bytes / 1e9
    assert 14.5 <= weights_gb <= 16.5            # article: ~14.5 GB; int4 + fp16 embeddings: ~15.9
    overhead = plan.activation_bytes + plan.non_torch_bytes
    # article: "~0.8-1 GB CUDA context and kernels" (its vLLM 0.6); V1 eager profiles less.
    assert 0.5e9 <= overhead <= 1.5e9
    # At the article's 0.85 (16 GB x 0.85 = 13.6 GB < 14.5 GB) the budget is below the weights.
    at085 = plan_memory(d, SEED000.replace(gpu_memory_utilization=0.85), strict=False)
    assert at085.budget_bytes < at085.weight_bytes and at085.num_gpu_blocks == 0
    # One 8k sequence of a 46-layer, 16-KV-head model needs 3.1 GB of fp16 KV, more than the
    # whole 1-1.5 GB the article says is left: "a handful of 8k sequences" cannot fit.
    one_8k = 8192 * plan.model.kv_bytes_per_token(1, 2)
    assert one_8k > 3e9
    assert plan.error is not None and plan.error.kind == "no_kv_memory"
    assert plan.kv_bytes < one_8k


def test_pre_ampere_gpus_ran_v0_until_0_10_2():
    d = lambda v: Deployment(model="qwen2.5-7b", gpu="V100-32GB-SXM2", vllm_version=v)  # noqa: E731
    old, new = (plan_memory(d(v), ServeConfig(max_model_len=4096)) for v in ("0.9.2", "0.26.0"))
    assert old.engine == "V0" and new.engine == "V1" and new.attention_backend == "TRITON_ATTN"
    assert any("float16" in n for n in new.notes)  # the bf16 checkpoint is cast on a V100
    h100 = plan_memory(Deployment(model="qwen2.5-7b", gpu="H100-SXM", vllm_version="0.9.2"),
                       ServeConfig(max_model_len=4096))
    assert h100.engine == "V1" and h100.attention_backend == "FLASH_ATTN"


# -- attention backends vLLM refuses with (vllm/attention/selector.py, platforms/cuda.py) -----
def test_gemma2_on_volta_or_turing_with_vllm_0_6_is_refused_in_xformers_words():
    # V0 on compute capability < 8.0 uses XFormers, which has no attention-logit soft cap
    for gpu in ("V100-32GB-SXM2", "T4"):
        dep = Deployment(model="gemma-2-9b", gpu=gpu, vllm_version="0.6.3", dtype="float16")
        with pytest.raises(ConfigRejected) as err:
            plan_memory(dep, ServeConfig(max_model_len=4096))
        assert err.value.kind == "attention"
        assert err.value.message == "XFormers does not support attention logits soft capping."
    # a model without a soft cap runs there, and Gemma 2 on an A100 (FlashAttention-2) too
    plan_memory(Deployment(model="qwen2.5-7b", gpu="V100-32GB-SXM2", vllm_version="0.6.3", dtype="float16"),
                ServeConfig(max_model_len=4096))
    plan_memory(Deployment(model="gemma-2-9b", gpu="A100-80GB", vllm_version="0.6.3"), ServeConfig(max_model_len=4096))


def test_an_fp8_kv_cache_moves_vllm_0_6_to_xformers_even_on_ampere():
    dep = Deployment(model="qwen2.5-7b", gpu="A100-80GB", vllm_version="0.6.3")
    plan = plan_memory(dep, ServeConfig(max_model_len=4096, kv_cache_dtype="fp8"))
    assert plan.attention_backend == "XFORMERS"
    assert any("Cannot use FlashAttention-2 backend for FP8 KV cache" in n for n in plan.notes)
    assert plan_memory(dep, ServeConfig(max_model_len=4096)).attention_backend == "FLASH_ATTN"
    # ... so Gemma 2 with an FP8 KV cache is refused there as on a V100
    with pytest.raises(ConfigRejected, match="soft capping"):
        plan_memory(Deployment(model="gemma-2-9b", gpu="A100-80GB", vllm_version="0.6.3"),
                    ServeConfig(max_model_len=4096, kv_cache_dtype="fp8"))


def test_v1_serves_fp8_kv_with_flash_attention_only_on_hopper():
    a100 = plan_memory(Deployment(model="qwen2.5-7b", gpu="A100-80GB"), ServeConfig(max_model_len=4096,
                                                                                  kv_cache_dtype="fp8"))
    h100 = plan_memory(Deployment(model="qwen2.5-7b", gpu="H100-SXM"), ServeConfig(max_model_len=4096,
                                                                                 kv_cache_dtype="fp8"))
    assert a100.attention_backend == "TRITON_ATTN" and h100.attention_backend == "FLASH_ATTN"


def test_xformers_only_warns_about_soft_capping_from_vllm_0_6_5():
    # vllm/attention/backends/xformers.py: 0.6.4.post1 raises, 0.6.5 logs a warning and runs
    dep = lambda v: Deployment(model="gemma-2-9b", gpu="V100-32GB-SXM2", vllm_version=v, dtype="float16")  # noqa: E731
    assert rejected(dep("0.6.4"), ServeConfig(max_model_len=4096)).kind == "attention"
    plan = plan_memory(dep("0.6.5"), ServeConfig(max_model_len=4096), strict=False)
    assert plan.attention_backend == "XFORMERS"
    assert "XFormers does not support logits soft cap. Outputs may be slightly off." in plan.notes


# -- what vLLM 0.6.x refuses on Volta (7.0) and Turing (7.5), in its words -------------------
def test_a_bf16_checkpoint_on_volta_or_turing_is_refused_before_vllm_0_9():
    # vLLM 0.6.6.post1 config.py::_get_and_verify_dtype keeps a bfloat16 checkpoint's dtype under
    # --dtype auto and worker/worker.py::_check_if_gpu_supports_dtype refuses it (the 0.6 line's
    # text runs "the`dtype`" together; 0.8.5 has the space); 0.9.0 casts to float16 (PR #17265)
    for gpu, cc, name in (("V100-32GB-SXM2", "7.0", "Tesla V100-SXM2-32GB"), ("T4", "7.5", "Tesla T4")):
        dep = Deployment(model="qwen2.5-7b", gpu=gpu, vllm_version="0.6.3")
        err = rejected(dep, ServeConfig(max_model_len=2048))
        assert err.kind == "dtype"
        assert err.message == (
            "Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
            f"Your {name} GPU has compute capability {cc}. You can use float16 instead by explicitly "
            "setting the`dtype` flag in CLI, for example: --dtype=half.")
    v100 = lambda v, **kw: Deployment(model="qwen2.5-7b", gpu="V100-32GB-SXM2", vllm_version=v, **kw)  # noqa: E731
    assert "setting the `dtype` flag" in rejected(v100("0.8.5"), ServeConfig(max_model_len=2048)).message
    # what the message says to do works, and from 0.9.0 vLLM does it by itself (with a note)
    assert plan_memory(v100("0.6.3", dtype="float16"), ServeConfig(max_model_len=2048)).kv_cache_dtype_bytes == 2
    cast = plan_memory(v100("0.9.2"), ServeConfig(max_model_len=2048))
    assert any("casts the bfloat16 checkpoint to float16" in n for n in cast.notes)
    # an Ampere GPU runs it as bfloat16 on every version; a float16 checkpoint runs on a V100
    plan_memory(Deployment(model="qwen2.5-7b", gpu="A100-80GB", vllm_version="0.6.3"), ServeConfig(max_model_len=2048))
    plan_memory(Deployment(model="llama-2-7b", gpu="V100-32GB-SXM2", vllm_version="0.6.3"),
                ServeConfig(max_model_len=2048))


def test_gemma2_in_float32_is_cast_to_bf16_and_refused_on_volta_by_vllm_0_6():
    # 0.6.6.post1: "For Gemma 2, we downcast float32 to bfloat16 instead of float16 by default."
    dep = Deployment(model="gemma-2-9b", gpu="V100-32GB-SXM2", vllm_version="0.6.3")  # config.json: float32
    assert rejected(dep, ServeConfig(max_model_len=4096)).kind == "dtype"
    llama = Deployment(model="llama-2-7b", gpu="V100-32GB-SXM2", vllm_version="0.6.3")
    assert plan_memory(llama, ServeConfig(max_model_len=2048)).attention_backend == "XFORMERS"


def test_fp8_weights_need_ampere_until_marlin_ran_on_turing():
    # Fp8Config.get_min_capability: 80 in 0.6.4.post1, 0.6.6.post1 and 0.8.5; 75 in 0.33.0
    t4 = lambda v: Deployment(model="qwen2.5-7b", gpu="T4", vllm_version=v, dtype="float16",  # noqa: E731
                              quantization="fp8")
    err = rejected(t4("0.6.3"), ServeConfig(max_model_len=2048))
    assert err.kind == "quantization"
    assert err.message == ("The quantization method fp8 is not supported for the current GPU. "
                           "Minimum capability: 80. Current capability: 75.")
    plan_memory(t4("0.26.0"), ServeConfig(max_model_len=2048, gpu_memory_utilization=0.9))
    v100 = Deployment(model="qwen2.5-7b", gpu="V100-32GB-SXM2", vllm_version="0.26.0", dtype="float16",
                      quantization="fp8")
    assert "Minimum capability: 75. Current capability: 70." in rejected(v100, ServeConfig(max_model_len=2048)).message


def test_v0_pagedattention_refuses_head_sizes_it_was_not_built_for(tmp_path):
    # attention/ops/paged_attn.py (0.6.6.post1): 32, 64, 80, 96, 112, 120, 128, 192, 256; V0 on an
    # A100 takes FlashAttention-2 for head size 160 but falls to XFormers for 72 (selector.py)
    import json

    def model(head_dim: int) -> str:
        folder = tmp_path / f"hd{head_dim}"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16 * head_dim,
            "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": head_dim,
            "intermediate_size": 4096, "num_hidden_layers": 4, "vocab_size": 32000, "torch_dtype": "float16",
            "max_position_embeddings": 4096}))
        return str(folder)

    cfg = ServeConfig(max_model_len=2048)
    err = rejected(Deployment(model=model(160), gpu="T4", vllm_version="0.6.3"), cfg)
    assert err.kind == "attention"
    assert err.message == ("Head size 160 is not supported by PagedAttention. Supported head sizes are: "
                           "[32, 64, 80, 96, 112, 120, 128, 192, 256].")
    assert plan_memory(Deployment(model=model(160), gpu="A100-80GB", vllm_version="0.6.3"),
                       cfg).attention_backend == "FLASH_ATTN"
    assert rejected(Deployment(model=model(72), gpu="A100-80GB", vllm_version="0.6.3"), cfg).kind == "attention"
    # V1's Triton attention on a T4 takes any head size
    plan_memory(Deployment(model=model(160), gpu="T4", vllm_version="0.26.0"), cfg)


def test_the_soft_cap_refusal_from_a_real_log_is_classified_as_attention():
    from tuner.backends.vllm_args import classify_failure

    log = ("INFO 12-06 14:41:06 selector.py:261] Cannot use FlashAttention-2 backend for Volta and Turing GPUs.\n"
           "ERROR 12-06 14:41:08 engine.py:366] ValueError: XFormers does not support attention logits soft capping.\n")
    err = classify_failure(1, log)
    assert err.kind == "attention" and err.message == "XFormers does not support attention logits soft capping."


def test_a_head_size_paged_attention_refuses_is_classified_as_attention():
    from tuner.backends.vllm_args import classify_failure

    message = ("Head size 160 is not supported by PagedAttention. Supported head sizes are: "
               "[32, 64, 80, 96, 112, 120, 128, 192, 256].")
    err = classify_failure(1, f"ERROR 12-06 14:41:08 engine.py:366] ValueError: {message}\n")
    assert err.kind == "attention" and err.message == message


def test_nemo_explicit_head_dim_sizes_the_pool_vllm_measured():
    # Mistral-Nemo-12B: head_dim 128 although hidden 5120 / 32 heads = 160. vLLM 0.26.0 on the
    # H200 (campaign 3) loaded 22.85 GiB of weights and made 41,509 blocks of its 101.34 GiB:
    # 101.34 GiB / (16 x 40 layers x 2 x 8 heads x 128 x 2 B = 2,621,440 B) = 41,509 by hand.
    # With 160 it would be 23.79 GiB of weights and 33,207 blocks.
    nemo = Deployment(model="mistral-nemo-12b", gpu="H200", vllm_version="0.26.0")
    plan = plan_memory(nemo, ServeConfig(gpu_memory_utilization=0.9, max_model_len=32768))
    assert plan.model.head_dim == 128 and plan.model.hidden_size // plan.model.num_heads == 160
    assert plan.page_bytes == 16 * 40 * 2 * 8 * 128 * 2
    assert plan.weight_bytes / GiB == pytest.approx(22.85, rel=0.005)
    assert plan.num_gpu_blocks == pytest.approx(41_509, rel=0.01)
    # and the full-attention log line is the pool in tokens
    assert plan.kv_cache_tokens == plan.num_gpu_blocks * 16

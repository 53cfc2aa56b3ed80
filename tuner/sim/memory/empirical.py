"""The memory planner's empirical constants: :data:`EMPIRICAL` (fitted to real vLLM logs),
their overrides by a calibration profile (:func:`empirical_for`), and the batched tokens the
profile run's peak activation scales with (:func:`activation_tokens`)."""
from __future__ import annotations

from typing import Any

from tuner.config import Deployment
from tuner.sim.hardware import GiB


MiB = 1 << 20

#: Empirical constants, fitted to vLLM 0.26.0 on one H200 (Qwen2.5-7B shape, bf16, TP 1,
#: /work/shared/tools/h200-vllm/README.md): "Model loading took 14.29 GiB"; gmu 0.9,
#: max-model-len 4096 -> "GPU KV cache size: 2,064,240 tokens", "Graph capturing ... took
#: 0.54 GiB"; gmu 0.12, max-model-len 32768 -> "available KV cache memory (1.14 GiB) ...
#: estimated maximum model length is 21408". Both runs imply 15.63 GiB outside the KV cache
#: with torch's total of 139.80 GiB; see docs/simulator-memory.md for the split.
EMPIRICAL = {
    # Transient peak of the profile forward pass, per batched token per hidden unit (bytes):
    # what is left of the 15.63 GiB after weights, sampler logits, graphs and non-torch.
    "activation_bytes_per_token_per_hidden": 5.0,
    # The dummy sampler run holds [max_num_seqs, vocab] fp32 logits (gpu_model_runner.py
    # _dummy_sampler_run); counted at 4 bytes per logit, once.
    "sampler_bytes_per_logit": 4,
    # Memory outside torch's allocator that grows during profiling (cuBLAS/cuDNN workspaces,
    # persistent runner buffers); an estimate, not measured separately.
    "non_torch_bytes": 200 * MiB,
    # Extra for NCCL and custom all-reduce buffers when TP > 1 (unmeasured estimate).
    "non_torch_tp_bytes": 400 * MiB,
    # CUDA-graph estimate per decoder layer per captured batch size: 0.54 GiB / (28 layers x
    # 51 sizes) on the H200 anchor (capture sizes 1,2,4,8..248 step 8, 256..512 step 16).
    "cudagraph_bytes_per_layer_per_size": 0.54 * GiB / (28 * 51),
    # V0 (vLLM < 0.8) measured non-KV memory as total - free after profiling, so the CUDA
    # context of the process counted against the budget (about 0.3-0.5 GiB on V100/A100).
    "cuda_context_bytes": 400 * MiB,
    # The three below are neutral here; a fitted calibration profile (tuner calibrate, its
    # ``memory`` section; tuner/data/calibration/h200-vllm-0.26.0/profile.yaml) sets them:
    # bytes "Model loading took" reports beyond the shapes' weights, a fixed part of the
    # profile run's peak activation, and the fraction of the CUDA-graph estimate that comes
    # out of the KV budget (vLLM 0.26.0 on the H200 logs it but does not subtract it).
    "weight_overhead_bytes": 0,
    "activation_fixed_bytes": 0,
    "cudagraph_kv_fraction": 1.0,
    # MoE layers add routed-token buffers to the profile run's peak: bytes per batched token
    # per routed expert slot (num_experts_per_tok) per hidden unit; 0 until a fit sets it.
    "moe_activation_bytes_per_token_per_hidden": 0.0,
    # With --enforce-eager the profile run is plain PyTorch, whose peak is not the compiled
    # graph's (vLLM 0.26.0 on the H200: 1.12 GiB eager at 8192 batched tokens, twice, where
    # compiled starts logged 1.03-1.13 GiB whatever the flag): bytes per batched token per
    # hidden unit of the eager forward; None means the compiled figure.
    "eager_activation_bytes_per_token_per_hidden": None,
}


def empirical_for(deployment: Deployment) -> dict[str, float]:
    """:data:`EMPIRICAL` with the overrides of the calibration profile that applies to the
    deployment (``Deployment.calibration``, else a fitted profile matching GPU and vLLM
    version; see :func:`tuner.sim.calibration.memory_overrides`)."""
    from tuner.sim.calibration import memory_overrides

    over = memory_overrides(deployment.gpu, deployment.vllm_version, deployment.calibration)
    return {**EMPIRICAL, **{k: v for k, v in over.items() if k in EMPIRICAL}}


def activation_tokens(max_num_batched_tokens: int, default_tokens: int, eager: bool) -> int:
    """Tokens the profile run's peak activation scales with. vLLM 0.26.0 on an H200 logged
    the same ~1.05 GiB of peak activation for the Qwen2.5-7B shape at max-num-batched-tokens
    1024, 2048, 4096 and 8192 with torch.compile and CUDA graphs, but 0.10 GiB eager at 512
    (calibration data h200-vllm-0.26.0, both campaigns): compiled, the peak follows the
    compiled range, which reaches the default batched tokens whatever the flag; eager, it
    follows the flag."""
    return max_num_batched_tokens if eager else max(max_num_batched_tokens, default_tokens)


def _activation_slope(emp: dict[str, Any], eager: bool) -> float:
    """Peak activation bytes per batched token per hidden unit of the profile run: the eager
    forward's own where a profile fitted it, else the compiled one's."""
    own = emp.get("eager_activation_bytes_per_token_per_hidden") if eager else None
    return float(emp["activation_bytes_per_token_per_hidden"] if own is None else own)

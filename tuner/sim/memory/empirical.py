"""The memory planner's empirical constants: :data:`EMPIRICAL` (fitted to real vLLM logs),
their overrides by a calibration profile (:func:`empirical_for`), the batched tokens the
profile run's peak activation scales with (:func:`activation_tokens`) and the bytes "Model
loading took" beyond the shapes' weights (:func:`weight_overhead`)."""
from __future__ import annotations

from typing import Any

from tuner.serving.config import Deployment
from tuner.sim.calibration import memory_overrides
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
    # _dummy_sampler_run); counted at 4 bytes per logit, once, on top of the forward. In vLLM
    # 0.26.0 (v1/worker/gpu/model_runner.py: profile_run, then _dummy_sampler_run on the
    # min(tokens, max_num_seqs) last hidden states; Sampler.sample's bf16 logits and their
    # fp32 copy) it runs after the forward's buffers are freed and stays under the forward's
    # peak at every measured start (16 or 1024 seqs: the same 1.13 GiB for the 7B shape), so
    # a profile fitted on it sets 0.
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
    # The ones below are neutral here; a fitted calibration profile (tuner calibrate, its
    # ``memory`` section; tuner/data/calibration/h200-vllm-0.26.0/profile.yaml) sets them:
    # bytes "Model loading took" reports beyond the shapes' weights (the median over the
    # fitted starts, and each measured shape's own figure by model name: 0.105 GiB for the
    # Qwen2.5-7B shape, 0.01-0.04 for the others on the H200), a fixed part of the
    # profile run's peak activation, and the fraction of the CUDA-graph estimate that comes
    # out of the KV budget (vLLM 0.26.0 on the H200 logs it but does not subtract it).
    "weight_overhead_bytes": 0,
    "weight_overhead_by_model": {},
    "activation_fixed_bytes": 0,
    "cudagraph_kv_fraction": 1.0,
    # A cold torch.compile runs inside vLLM's profile run, in the window whose allocator peak
    # vLLM charges as activation (vLLM issue #54122, PR #54209: "Compilation's temporaries
    # are freed before that forward, so [they are charged] as activation memory"): bytes per
    # vocabulary x hidden element of that peak, compiled starts only. vLLM 0.26.0 on the H200,
    # every freshly compiled start: 2.0 (one bf16 vocab x hidden buffer) with 4.2 bytes per
    # batched token per hidden unit fits the logged peaks within 0.003 GiB (Qwen2.5-7B at
    # 1024, 2048, 4096, 8192 batched tokens: 1.03, 1.04, 1.07, 1.13 GiB; Qwen2.5-32B 1.61;
    # Mistral-Nemo-12B 1.41). 0 here: without it the compiled peak is taken at the default
    # batched tokens (:func:`activation_tokens`), this table's stand-in for the same peak.
    "compile_bytes_per_vocab_hidden": 0.0,
    # MoE layers add routed-token buffers to the profile run's peak: bytes per batched token
    # per routed expert slot (num_experts_per_tok) per hidden unit; 0 until a fit sets it.
    "moe_activation_bytes_per_token_per_hidden": 0.0,
    # With --enforce-eager the profile run is plain PyTorch, whose peak is not the compiled
    # graph's (vLLM 0.26.0 on the H200: 1.12 GiB eager at 8192 batched tokens, twice, where
    # compiled starts logged 1.03-1.13 GiB whatever the flag): bytes per batched token per
    # hidden unit of the eager forward; None means the compiled figure.
    "eager_activation_bytes_per_token_per_hidden": None,
}


def empirical_for(deployment: Deployment) -> dict[str, Any]:
    """:data:`EMPIRICAL` with the overrides of the calibration profile that applies to the
    deployment (``Deployment.calibration``, else a fitted profile matching GPU and vLLM
    version; see :func:`tuner.sim.calibration.memory_overrides`)."""

    over = memory_overrides(deployment.gpu, deployment.vllm_version, deployment.calibration)
    return {**EMPIRICAL, **{k: v for k, v in over.items() if k in EMPIRICAL}}


def activation_tokens(max_num_batched_tokens: int, default_tokens: int, eager: bool,
                      compile_term: float = 0.0) -> int:
    """Tokens the profile run's peak activation scales with. vLLM's profile run pushes
    max-num-batched-tokens through the model (``GPUModelRunner.profile_run`` ->
    ``_dummy_run(self.max_num_tokens)``), so with a fitted cold-compile term
    (``compile_bytes_per_vocab_hidden`` > 0) it is the flag. Without one (the neutral table)
    the compiled peak is taken at the default batched tokens whatever the flag: vLLM 0.26.0
    on an H200 logged 1.03-1.13 GiB for the Qwen2.5-7B shape at 1024-8192 batched tokens
    compiled, where eager it followed the flag (0.10 GiB at 512, 1.12 at 8192)."""
    if eager or compile_term > 0:
        return max_num_batched_tokens
    return max(max_num_batched_tokens, default_tokens)


def weight_overhead(emp: dict[str, Any], model_name: str) -> int:
    """Bytes "Model loading took" reports beyond the model's weight shapes: the model's own
    measured figure where a profile has one (``weight_overhead_by_model``), else the one the
    profile fitted for all (``weight_overhead_bytes``). The figure is not the same for
    every shape (vLLM 0.26.0, H200: Qwen2.5-7B 0.105 GiB, Llama-3.1-8B 0.04, Qwen2.5-32B
    0.01), and at a refusal a few hundredths of a GiB are a few percent of the KV cache."""
    own = (emp.get("weight_overhead_by_model") or {}).get(model_name)
    return int(emp["weight_overhead_bytes"] if own is None else own)


def _activation_slope(emp: dict[str, Any], eager: bool) -> float:
    """Peak activation bytes per batched token per hidden unit of the profile run: the eager
    forward's own where a profile fitted it, else the compiled one's."""
    own = emp.get("eager_activation_bytes_per_token_per_hidden") if eager else None
    return float(emp["activation_bytes_per_token_per_hidden"] if own is None else own)

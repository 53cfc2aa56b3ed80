"""vLLM's startup memory decision, reproduced: how many KV-cache blocks it allocates,
or which error it refuses to start with.

V1 (``v1/worker/gpu_worker.py::determine_available_memory``, ``v1/core/kv_cache_utils.py``)::

    budget     = ceil(total_memory * gpu_memory_utilization)      # fraction of TOTAL memory
    available  = budget - weights - peak activations of a profile run
                        - non-torch memory - CUDA-graph estimate (unless eager; since 0.21)
    num_blocks = available // page_bytes                          # one null block among them
    tokens     = num_blocks / cdiv(max_model_len, block) * max_model_len

The few numbers that cannot be derived from shapes (activation bytes, non-torch memory,
CUDA-graph memory) are fitted to real vLLM 0.26.0 logs on an H200 and kept together in
:data:`EMPIRICAL`; ``docs/simulator-memory.md`` shows the arithmetic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tuner.config import Deployment, ServeConfig
from tuner.errors import ConfigRejected, InputError
from tuner.sim.hardware import GPU, GiB, get_gpu
from tuner.sim.model import ModelSpec, load_model
from tuner.versions import parse_version

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

#: ``get_min_capability`` of vLLM's quantisation methods (model_executor/layers/quantization/,
#: read from vLLM 0.33.0; see vllm-facts.md section 4).
MIN_CAPABILITY = {
    "fp8": 75,
    "awq": 75,
    "awq_marlin": 80,
    "gptq": 60,
    "gptq_marlin": 80,
    "compressed-tensors": 70,
    "bitsandbytes": 70,
}
#: Before Marlin ran on Turing (PR #29901, merged December 2025), FP8 weights needed the
#: Ampere FP8 Marlin kernel: ``Fp8Config.get_min_capability`` returns 80 in vLLM 0.6.4.post1,
#: 0.6.6.post1 and 0.8.5 (model_executor/layers/quantization/fp8.py). The first release
#: carrying #29901 is taken to be 0.13.0 (not verified; 0.8.5 reads 80, 0.33.0 reads 75).
MIN_CAPABILITY_BEFORE_TURING_MARLIN = {**MIN_CAPABILITY, "fp8": 80}
TURING_MARLIN_SINCE = (0, 13, 0)
#: ``dtype auto`` on a bfloat16 checkpoint falls back to float16 below compute capability 8.0
#: only from 0.9.0 (PR #17265, merged 2025-04-27; 0.8.5's config.py keeps bfloat16, 0.9.2 logs
#: "Falling back to torch.float16 for compatibility."). Before, the worker refuses bfloat16
#: (worker/worker.py::_check_if_gpu_supports_dtype).
BF16_FALLBACK_SINCE = (0, 9, 0)
#: XFormers refused attention-logit soft capping (Gemma 2) until 0.6.4.post1
#: (attention/backends/xformers.py: raise ValueError); 0.6.5 only warns.
XFORMERS_SOFTCAP_WARNS_SINCE = (0, 6, 5)
#: Head sizes V0's PagedAttention kernels (the XFormers backend) take, vLLM 0.6.6.post1
#: (attention/ops/paged_attn.py::get_supported_head_sizes).
PAGED_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 120, 128, 192, 256)

#: Version where gpu_memory_utilization's default became 0.92. vllm-facts.md reads 0.92 in
#: 0.33.0 and 0.9 in older releases; the first release with 0.92 is NOT verified. We assume it
#: arrived with the CUDA-graph memory estimate (0.21.0), which took graphs out of the KV share.
GMU_092_SINCE = (0, 21, 0)
#: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 is the default "since v0.21.0" (vLLM's log).
CUDAGRAPH_ESTIMATE_SINCE = (0, 21, 0)
#: V1 engine became the default in 0.8.0; older lines are V0 (different defaults and messages).
V1_SINCE = (0, 8, 0)
#: V1 first ran on compute capability < 8.0 in 0.10.2 (PRs #23614, #24022); before that vLLM
#: fell back to V0 on V100/T4 (vllm-facts.md section 4).
V1_PRE_AMPERE_SINCE = (0, 10, 2)
#: max_num_seqs 1024 on >= 70 GiB non-A100 GPUs (get_batch_defaults); first release not verified.
SEQS_1024_SINCE = (0, 10, 0)

_DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def fmt_gib(n: float) -> str:
    """vLLM's ``format_gib``: GiB rounded to 2 decimals ("1.75 GiB", "3.0 GiB")."""
    return f"{round(n / GiB, 2)} GiB"


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """What vLLM decides at startup for one engine (one replica; figures per TP rank)."""

    gpu: GPU
    model: ModelSpec
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    enable_prefix_caching: bool
    enforce_eager: bool
    kv_cache_dtype_bytes: int
    budget_bytes: int
    weight_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    kv_bytes: int
    page_bytes: int
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    # Beyond the contract:
    dtype: str = "bfloat16"
    quantization: str | None = None
    vllm_version: str = ""
    replicas: int = 1
    attention_backend: str = ""
    engine: str = "V1"                    # "V0" for vLLM < 0.8, or < 0.10.2 below CC 8.0
    notes: tuple[str, ...] = ()           # warnings vLLM would log, and our approximations
    error: ConfigRejected | None = None   # set only by plan_memory(..., strict=False)

    def __post_init__(self) -> None:
        if self.error is None and self.num_gpu_blocks < 1:
            raise InputError("a MemoryPlan without error needs at least one KV block")

    @property
    def v1(self) -> bool:
        return self.engine == "V1"

    def log_lines(self) -> list[str]:
        """The startup lines vLLM logs, in vLLM's wording (V1)."""
        lines = [f"Model loading took {fmt_gib(self.weight_bytes)} memory"]
        if self.error is not None:
            return lines + [self.error.message]
        lines.append(f"Available KV cache memory: {fmt_gib(self.kv_bytes)}")
        if not self.v1:
            return lines + [
                f"# GPU blocks: {self.num_gpu_blocks}, # CPU blocks: 0",
                f"Maximum concurrency for {self.max_model_len} tokens per request: "
                f"{self.max_concurrency:.2f}x",
            ]
        lines.append(
            f"GPU KV cache size: {self.kv_cache_tokens:,} tokens, Maximum concurrency for "
            f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
        )
        if not self.enforce_eager and self.cudagraph_bytes:
            lines.append(f"Graph capturing finished, took {fmt_gib(self.cudagraph_bytes)}")
        return lines

    def summary(self) -> dict:
        """Plain numbers for JSON output and notebooks."""
        return {
            "gpu": self.gpu.name,
            "model": self.model.name,
            "vllm_version": self.vllm_version,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "replicas": self.replicas,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "enforce_eager": self.enforce_eager,
            "kv_cache_dtype_bytes": self.kv_cache_dtype_bytes,
            "total_memory_bytes": self.gpu.memory_bytes,
            "budget_bytes": self.budget_bytes,
            "weight_bytes": self.weight_bytes,
            "activation_bytes": self.activation_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "cudagraph_bytes": self.cudagraph_bytes,
            "kv_bytes": self.kv_bytes,
            "page_bytes": self.page_bytes,
            "num_gpu_blocks": self.num_gpu_blocks,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": self.max_concurrency,
            "engine": self.engine,
            "attention_backend": self.attention_backend,
            "notes": list(self.notes),
            "error": None if self.error is None else self.error.message,
            "error_kind": None if self.error is None else self.error.kind,
            "estimated_max_model_len": None
            if self.error is None
            else self.error.estimated_max_model_len,
        }


# ----------------------------------------------------------------------------- defaults
def default_gpu_memory_utilization(version: tuple[int, int, int]) -> float:
    return 0.92 if version >= GMU_092_SINCE else 0.9


def uses_v1_engine(gpu: GPU, version: tuple[int, int, int]) -> bool:
    return version >= V1_SINCE and (gpu.cc >= 80 or version >= V1_PRE_AMPERE_SINCE)


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


def default_batch_limits(
    gpu: GPU, version: tuple[int, int, int], max_model_len: int
) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) when the flags are unset, for ``vllm serve``.

    V1: ``engine/arg_utils.py::get_batch_defaults`` (vllm-facts.md section 2, and the same
    table read in v0.27.1's source): >= 70 GiB and not A100 -> 8192 tokens / 1024 seqs
    (PR #17885 excluded A100), otherwise 2048 / 256; the token budget is capped at
    max_num_seqs * max_model_len. V0 (< 0.8, unverified): 256 seqs; chunked prefill on only
    when max_model_len > 32768 (budget 512), otherwise the budget is max(max_model_len, 2048).
    """
    if not uses_v1_engine(gpu, version):
        seqs = 256
        tokens = 512 if max_model_len > 32768 else max(max_model_len, 2048)
        return seqs, tokens
    big = gpu.memory_bytes >= 70 * GiB and "a100" not in gpu.name.lower()
    tokens = 8192 if big else 2048
    seqs = 1024 if big and version >= SEQS_1024_SINCE else 256
    return seqs, min(tokens, seqs * max_model_len)


def _no_bfloat16(gpu: GPU, version: tuple[int, int, int]) -> ConfigRejected:
    """vLLM's refusal of bfloat16 below compute capability 8.0 (``_check_if_gpu_supports_dtype``;
    the 0.6 line's text lacks a space before `dtype`: 0.6.4.post1-0.6.6.post1; 0.8.5 has it)."""
    space = " " if version >= (0, 7, 0) else ""
    return ConfigRejected(
        "dtype",
        "Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
        f"Your {gpu.torch_name} GPU has compute capability "
        f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}. You can use float16 "
        f"instead by explicitly setting the{space}`dtype` flag in CLI, for example: --dtype=half.",
    )


def resolve_dtype(deployment: Deployment, model: ModelSpec, gpu: GPU, quant: str | None,
                  version: tuple[int, int, int] = (99, 0, 0)) -> str:
    """The dtype vLLM runs in, or ConfigRejected('dtype') for bf16 below CC 8.0
    (``platforms/cuda.py``; ``config/model.py::_resolve_auto_dtype``). Before 0.9.0 ``auto``
    keeps a bfloat16 checkpoint's dtype (and turns Gemma 2's float32 into bfloat16:
    ``config.py::_get_and_verify_dtype``, 0.6.6.post1), so a V100 or T4 refuses it."""
    want = deployment.dtype
    if want in ("bfloat16",):
        if not gpu.bf16:
            raise _no_bfloat16(gpu, version)
        return "bfloat16"
    if want in ("float16", "half"):
        return "float16"
    if want == "float32":
        return "float32"
    # auto: the checkpoint's dtype; bf16 (or fp32) falls back to fp16 where bf16 is missing;
    # AWQ/GPTQ kernels run in fp16.
    if quant in ("awq", "gptq"):
        return "float16"
    native = model.torch_dtype
    if version < BF16_FALLBACK_SINCE and not gpu.bf16 and (
            native == "bfloat16" or (native == "float32" and model.model_type == "gemma2")):
        raise _no_bfloat16(gpu, version)
    if native in ("bfloat16", "float32"):
        return "bfloat16" if gpu.bf16 else "float16"
    return "float16"


#: Head sizes V0's FlashAttention-2 backend takes, vLLM 0.6.6.post1
#: (attention/backends/flash_attn.py::get_supported_head_sizes).
FLASH_ATTN_V0_HEAD_SIZES = (32, 64, 96, 128, 160, 192, 224, 256)


def attention_backend(gpu: GPU, version: tuple[int, int, int], kv_cache_dtype: str = "auto",
                      head_dim: int = 128, block_size: int = 16) -> str:
    """The attention backend vLLM picks. V0 (``attention/selector.py::which_attn_to_use``,
    0.6.6.post1): FlashAttention-2 needs compute capability 8.0, cannot serve an FP8 KV cache
    ("Cannot use FlashAttention-2 backend for FP8 KV cache."), a block size not divisible by 16
    or a head size it was not built for: XFormers otherwise. V1 (``platforms/cuda.py``):
    FLASH_ATTN on 8.0+, but FP8 KV only through FlashAttention 3 (Hopper), so Ampere and Ada
    fall to TRITON_ATTN for it; TRITON_ATTN below 8.0."""
    fp8 = kv_cache_dtype.startswith("fp8")
    if not uses_v1_engine(gpu, version):
        flash = gpu.cc >= 80 and not fp8 and block_size % 16 == 0 and head_dim in FLASH_ATTN_V0_HEAD_SIZES
        return "FLASH_ATTN" if flash else "XFORMERS"
    if gpu.cc >= 90 or (gpu.cc >= 80 and not fp8):
        return "FLASH_ATTN"
    return "TRITON_ATTN"


def check_attention(model: ModelSpec, backend: str, version: tuple[int, int, int] = (99, 0, 0)) -> list[str]:
    """What the chosen backend cannot run, in vLLM's words (``vllm/attention/backends/
    xformers.py``): up to 0.6.4.post1 XFormers refuses attention-logit soft capping (Gemma 2
    on a V100 or T4, or with an FP8 KV cache): "XFormers does not support attention logits
    soft capping."; from 0.6.5 it warns. Its PagedAttention kernels take a fixed set of head
    sizes. Returns the warnings vLLM logs instead of refusing."""
    if backend != "XFORMERS":
        return []
    if model.head_dim not in PAGED_ATTENTION_HEAD_SIZES:
        raise ConfigRejected(
            "attention",
            f"Head size {model.head_dim} is not supported by PagedAttention. Supported head sizes "
            f"are: {list(PAGED_ATTENTION_HEAD_SIZES)}.",
        )
    if model.attn_logit_softcapping:
        if version < XFORMERS_SOFTCAP_WARNS_SINCE:
            raise ConfigRejected("attention", "XFormers does not support attention logits soft capping.")
        return ["XFormers does not support logits soft cap. Outputs may be slightly off."]
    return []


def check_block_size(block_size: int, backend: str) -> None:
    """V1's FLASH_ATTN and TRITON_ATTN take any multiple of 16 (vllm-facts.md section 2);
    V0's CLI offered 8/16/32 (plus 64/128 on some backends). The wording is ours: vLLM
    rejects these during backend selection with backend-specific text."""
    if backend == "XFORMERS":
        if block_size not in (8, 16, 32):
            raise ConfigRejected(
                "block_size",
                f"Block size {block_size} is not supported by the XFORMERS attention backend "
                "(choose 8, 16 or 32).",
            )
        return
    if block_size % 16:
        raise ConfigRejected(
            "block_size",
            f"Block size {block_size} is not supported by the {backend} attention backend "
            "(it needs a multiple of 16).",
        )


def _cudagraph_sizes(max_num_seqs: int) -> int:
    """How many batch sizes vLLM captures: 1, 2, 4, 8..248 by 8, 256.. by 16, up to
    ``min(2 * max_num_seqs, 512)`` (config/vllm.py)."""
    cap = min(2 * max_num_seqs, 512)
    sizes = [s for s in (1, 2, 4) if s <= cap]
    sizes += [s for s in range(8, 256, 8) if s <= cap]
    sizes += [s for s in range(256, cap + 1, 16)]
    return len(sizes)


def _estimate_max_model_len(available: int, block_size: int, page_bytes: int, limit: int) -> int:
    """vLLM's ``estimate_max_model_len`` (v1/core/kv_cache_utils.py): binary search for the
    longest length whose blocks fit the available memory; 0 when not even one token fits."""
    memory = available
    lo, hi, best = 1, limit, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if math.ceil(mid / block_size) * page_bytes <= memory:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


# ----------------------------------------------------------------------------- planner
def plan_memory(deployment: Deployment, config: ServeConfig, *, strict: bool = True) -> MemoryPlan:
    """vLLM's startup decision for ``config`` on ``deployment``.

    Resolves ``None`` knobs to the vLLM version's defaults. Raises
    :class:`~tuner.errors.ConfigRejected` with vLLM's own message where vLLM refuses to
    start. With ``strict=False`` the memory refusals (no memory for the cache, max-model-len
    does not fit) come back in ``plan.error`` with the rest of the plan filled in, so a
    what-if can show the arithmetic; other refusals still raise.
    """
    gpu = get_gpu(deployment.gpu)
    model = load_model(deployment.model)
    version = parse_version(deployment.vllm_version)
    tp, replicas = config.tensor_parallel_size, config.replicas

    if tp * replicas > deployment.gpu_count:
        raise ConfigRejected(
            "layout",
            f"tensor_parallel_size {tp} x {replicas} replicas needs {tp * replicas} GPUs but the "
            f"deployment has {deployment.gpu_count}.",
        )
    if model.num_heads % tp:
        raise ConfigRejected(
            "tensor_parallel",
            f"Total number of attention heads ({model.num_heads}) must be divisible by tensor "
            f"parallel size ({tp}).",
        )

    quant = model.resolve_quantization(deployment.quantization)
    asked = (deployment.quantization or "").replace("_marlin", "")
    if asked and model.quantization and asked != model.quantization.replace("_marlin", ""):
        raise ConfigRejected(
            "quantization",
            f"Quantization method specified in the model config ({model.quantization}) does not "
            f"match the quantization method specified in the `quantization` argument "
            f"({deployment.quantization}).",
        )
    if quant is not None:
        # vLLM upgrades awq/gptq checkpoints to their Marlin kernels where the GPU allows.
        if quant in ("awq", "gptq") and not deployment.quantization and gpu.cc >= 80:
            quant = f"{quant}_marlin"
        table = MIN_CAPABILITY if version >= TURING_MARLIN_SINCE else MIN_CAPABILITY_BEFORE_TURING_MARLIN
        need = table.get(quant)
        if need is not None and gpu.cc < need:
            raise ConfigRejected(
                "quantization",
                f"The quantization method {quant} is not supported for the current GPU. "
                f"Minimum capability: {need}. Current capability: {gpu.cc}.",
            )
    dtype = resolve_dtype(deployment, model, gpu, quant.replace("_marlin", "") if quant else None, version)
    dtype_bytes = 4 if dtype == "float32" else 2

    derived_len = model.max_position_embeddings
    max_model_len = config.max_model_len or derived_len
    if max_model_len > derived_len:
        raise ConfigRejected(
            "max_model_len",
            f"User-specified max_model_len ({max_model_len}) is greater than the derived "
            f"max_model_len (max_position_embeddings={derived_len} or model_max_length=None in "
            "model's config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
        )

    v1 = uses_v1_engine(gpu, version)
    backend = attention_backend(gpu, version, config.kv_cache_dtype, model.head_dim, config.block_size or 16)
    notes: list[str] = check_attention(model, backend, version)
    if backend == "XFORMERS" and gpu.cc >= 80 and config.kv_cache_dtype.startswith("fp8"):
        notes.append("vLLM's V0 engine serves an FP8 KV cache with XFormers, not FlashAttention-2 "
                     "(\"Cannot use FlashAttention-2 backend for FP8 KV cache.\"): slower attention")
    if deployment.dtype == "auto" and model.torch_dtype == "bfloat16" and dtype == "float16" \
            and not gpu.bf16:
        notes.append(f"{gpu.name} has no bfloat16 (compute capability "
                     f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}): vLLM casts the "
                     "bfloat16 checkpoint to float16")
    if version >= V1_SINCE and not v1:
        notes.append(f"vLLM {deployment.vllm_version} runs the V0 engine below compute "
                     "capability 8.0 (V1 supports it from 0.10.2)")
    if gpu.cc < 75 and version >= (0, 11, 0):
        notes.append("vLLM's recent official wheels (CUDA >= 12.8) ship no sm_70 kernels; a V100 "
                     "needs a build against CUDA < 12.8 (first release affected not pinned down)")
    if model.sliding_window and model.model_type.startswith(("gemma2", "gemma3", "mistral")):
        notes.append(f"sliding-window layers (window {model.sliding_window}) are planned as full "
                     "attention: V1's hybrid allocator would hold more tokens")
    block_size = config.block_size or 16
    check_block_size(block_size, backend)

    gmu = config.gpu_memory_utilization or default_gpu_memory_utilization(version)
    default_seqs, default_tokens = default_batch_limits(gpu, version, max_model_len)
    max_num_seqs = config.max_num_seqs or default_seqs
    if config.max_num_seqs is None and config.max_num_batched_tokens is not None:
        # The default path never produces max_num_seqs > max_num_batched_tokens
        # (engine/arg_utils.py clamps the defaulted value).
        max_num_seqs = min(max_num_seqs, config.max_num_batched_tokens)
    if config.max_num_batched_tokens is not None:
        max_num_batched_tokens = config.max_num_batched_tokens
    elif config.max_num_seqs is not None and v1:
        max_num_batched_tokens = min(default_tokens, max_num_seqs * max_model_len)
    else:
        max_num_batched_tokens = default_tokens
    if max_num_batched_tokens < max_num_seqs:
        raise ConfigRejected(
            "batch_tokens",
            f"max_num_batched_tokens ({max_num_batched_tokens}) must be greater than or equal "
            f"to max_num_seqs ({max_num_seqs}).",
        )
    if not v1 and max_model_len <= 32768 and max_num_batched_tokens < max_model_len:
        raise ConfigRejected(
            "batch_tokens",
            f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than max_model_len "
            f"({max_model_len}). This effectively limits the maximum sequence length to "
            "max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
            "max_num_batched_tokens or decrease max_model_len.",
        )

    kv_dtype_bytes = 1 if config.kv_cache_dtype.startswith("fp8") else dtype_bytes

    # ---- memory arithmetic (per TP rank)
    emp = empirical_for(deployment)
    weights = model.weight_bytes_per_rank(quant, tp)
    if dtype_bytes == 4 and quant is None:
        weights *= 2
    weights += int(emp["weight_overhead_bytes"])
    budget = math.ceil(gpu.memory_bytes * gmu)
    hidden = model.hidden_size
    tokens = activation_tokens(max_num_batched_tokens, default_tokens, config.enforce_eager)
    activations = int(
        emp["activation_fixed_bytes"]
        + tokens * hidden * _activation_slope(emp, config.enforce_eager)
        + max_num_seqs * model.vocab_size * emp["sampler_bytes_per_logit"]
        + (tokens * model.num_experts_per_tok * hidden
           * emp["moe_activation_bytes_per_token_per_hidden"] if model.is_moe else 0)
    )
    non_torch = int(emp["non_torch_bytes"] + (emp["non_torch_tp_bytes"] if tp > 1 else 0))
    if not v1:
        non_torch += int(emp["cuda_context_bytes"])
    graphs = 0
    if not config.enforce_eager and version >= CUDAGRAPH_ESTIMATE_SINCE:
        graphs = int(
            emp["cudagraph_bytes_per_layer_per_size"]
            * model.num_layers
            * _cudagraph_sizes(max_num_seqs)
        )
    kv_bytes = budget - weights - activations - non_torch - int(graphs * emp["cudagraph_kv_fraction"])
    page_bytes = block_size * model.kv_bytes_per_token(tp, kv_dtype_bytes)

    def plan(num_blocks: int, error: ConfigRejected | None) -> MemoryPlan:
        per_req = math.ceil(max_model_len / block_size)
        concurrency = num_blocks / per_req if num_blocks > 0 else 0.0
        return MemoryPlan(
            gpu=gpu, model=model, tensor_parallel_size=tp, gpu_memory_utilization=gmu,
            max_model_len=max_model_len, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            enforce_eager=config.enforce_eager, kv_cache_dtype_bytes=kv_dtype_bytes,
            budget_bytes=budget, weight_bytes=weights, activation_bytes=activations,
            non_torch_bytes=non_torch, cudagraph_bytes=graphs, kv_bytes=kv_bytes,
            page_bytes=page_bytes, num_gpu_blocks=max(0, num_blocks),
            kv_cache_tokens=int(concurrency * max_model_len), max_concurrency=concurrency,
            dtype=dtype, quantization=quant, vllm_version=deployment.vllm_version,
            replicas=replicas, attention_backend=backend, engine="V1" if v1 else "V0",
            notes=tuple(notes), error=error,
        )

    def refuse(err: ConfigRejected) -> MemoryPlan:
        if strict:
            raise err
        return plan(max(0, kv_bytes // page_bytes), err)

    if weights > gpu.memory_bytes:
        raise ConfigRejected(
            "oom",
            f"CUDA out of memory while loading the model: {fmt_gib(weights)} of weights per GPU "
            f"exceed the {fmt_gib(gpu.memory_bytes)} the {gpu.name} has.",
        )
    # V0 checked the block count (worker.py::raise_if_cache_size_invalid), V1 the bytes.
    if kv_bytes <= 0 or (not v1 and kv_bytes < page_bytes):
        if not v1:
            msg = ("No available memory for the cache blocks. Try increasing "
                   "`gpu_memory_utilization` when initializing the engine.")
        else:
            msg = ("No available memory for the cache blocks. Try increasing "
                   "`gpu_memory_utilization` when initializing the engine (this flag also "
                   "controls CPU memory reservation on the CPU backend, despite its name). "
                   + _DOCS)
        return refuse(ConfigRejected("no_kv_memory", msg))

    num_blocks = kv_bytes // page_bytes
    needed = math.ceil(max_model_len / block_size) * page_bytes
    if not v1:
        capacity = num_blocks * block_size
        if max_model_len > capacity:
            return refuse(ConfigRejected(
                "max_model_len",
                f"The model's max seq len ({max_model_len}) is larger than the maximum number of "
                f"tokens that can be stored in KV cache ({capacity}). Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
                "engine.",
                estimated_max_model_len=capacity,
            ))
    elif needed > kv_bytes:
        estimate = _estimate_max_model_len(kv_bytes, block_size, page_bytes, max_model_len)
        return refuse(ConfigRejected(
            "max_model_len",
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({fmt_gib(needed)} KV cache is needed, which is larger than the available KV cache "
            f"memory ({fmt_gib(kv_bytes)}). "
            + (f"Based on the available memory, the estimated maximum model length is {estimate}. "
               if estimate > 0 else "")
            + "Try increasing `gpu_memory_utilization` (which also "
            "controls CPU memory on the CPU backend) or decreasing `max_model_len` when "
            f"initializing the engine. {_DOCS}",
            estimated_max_model_len=estimate,
        ))
    return plan(num_blocks, None)

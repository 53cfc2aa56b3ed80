"""The memory planner: :func:`plan_memory`, vLLM's startup decision for a configuration
(the KV-cache blocks it allocates, or the error it refuses to start with), and the CUDA-graph
and maximum-model-length estimates it makes on the way.

The decision runs in vLLM's order, one phase a function: the layout and the checkpoint
(:func:`_check_layout`, :func:`_quantization`, :func:`_max_model_len`), the engine and the
attention backend (:func:`_notes`), the knobs left to vLLM's defaults (:func:`_resolved`), the
bytes of one rank (:func:`_memory`) and the refusal, if any (:func:`_refusal`)."""
from __future__ import annotations

import math
from typing import Any

from tuner.core.errors import ConfigRejected
from tuner.core.knobs import KNOBS
from tuner.core.versions import parse_version
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.hardware import GPU, get_gpu
from tuner.sim.memory.defaults import (
    CUDAGRAPH_ESTIMATE_SINCE,
    V1_SINCE,
    default_batch_limits,
    default_gpu_memory_utilization,
    uses_v1_engine,
)
from tuner.sim.memory.empirical import _activation_slope, activation_tokens, empirical_for, weight_overhead
from tuner.sim.memory.plan import MemoryPlan, fmt_gib
from tuner.sim.memory.support import (
    MIN_CAPABILITY,
    MIN_CAPABILITY_BEFORE_TURING_MARLIN,
    NO_SM70_WHEELS_SINCE,
    TURING_MARLIN_SINCE,
    attention_backend,
    check_attention,
    check_block_size,
    resolve_dtype,
)
from tuner.sim.model import ModelSpec, load_model

Version = tuple[int, int, int]

_DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


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


def plan_memory(deployment: Deployment, config: ServeConfig, *, strict: bool = True) -> MemoryPlan:
    """vLLM's startup decision for ``config`` on ``deployment``.

    Resolves ``None`` knobs to the vLLM version's defaults (the plan's ``config``). Raises
    :class:`~tuner.core.errors.ConfigRejected` with vLLM's own message where vLLM refuses to
    start. With ``strict=False`` the memory refusals (no memory for the cache, max-model-len
    does not fit) come back in ``plan.error`` with the rest of the plan filled in, so a
    what-if can show the arithmetic; other refusals still raise.
    """
    for knob in KNOBS:  # a flag the version does not have: refused before anything starts, as render_flags does
        knob.check(getattr(config, knob.name), deployment.vllm_version)
    gpu = get_gpu(deployment.gpu)
    model = load_model(deployment.model)
    version = parse_version(deployment.vllm_version)
    _check_layout(deployment, config, model)
    quant = _quantization(deployment, model, gpu, version)
    dtype = resolve_dtype(deployment, model, gpu, quant.replace("_marlin", "") if quant else None, version)
    max_model_len = _max_model_len(config, model)
    v1 = uses_v1_engine(gpu, version)
    block_size = config.block_size or 16
    backend = attention_backend(gpu, version, config.kv_cache_dtype, model.head_dim, block_size)
    notes = _notes(deployment, config, gpu, model, version, dtype, backend, v1)
    check_block_size(block_size, backend)
    resolved, default_tokens = _resolved(config, gpu, version, v1, max_model_len, block_size)
    facts = dict(gpu=gpu, model=model, config=resolved, dtype=dtype, quantization=quant,
                 vllm_version=deployment.vllm_version, attention_backend=backend,
                 engine="V1" if v1 else "V0", notes=tuple(notes),
                 **_memory(deployment, resolved, gpu, model, quant, dtype, v1, version, default_tokens))
    if facts["weight_bytes"] > gpu.memory_bytes:
        raise ConfigRejected(
            "oom",
            f"CUDA out of memory while loading the model: {fmt_gib(facts['weight_bytes'])} of weights per GPU "
            f"exceed the {fmt_gib(gpu.memory_bytes)} the {gpu.name} has.",
        )
    error = _refusal(facts["kv_bytes"], facts["page_bytes"], resolved, v1)
    if error is not None and strict:
        raise error
    return _with_blocks(facts, max(0, facts["kv_bytes"] // facts["page_bytes"]), error)


def _check_layout(deployment: Deployment, config: ServeConfig, model: ModelSpec) -> None:
    """The layout's GPUs exist, and tensor parallelism divides the attention heads."""
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


def _quantization(deployment: Deployment, model: ModelSpec, gpu: GPU, version: Version) -> str | None:
    """The quantization vLLM runs the checkpoint with (awq/gptq upgraded to their Marlin kernels
    where the GPU allows), or its refusal: a method the checkpoint does not have, or one the GPU
    is too old for."""
    quant = model.resolve_quantization(deployment.quantization)
    asked = (deployment.quantization or "").replace("_marlin", "")
    if asked and model.quantization and asked != model.quantization.replace("_marlin", ""):
        raise ConfigRejected(
            "quantization",
            f"Quantization method specified in the model config ({model.quantization}) does not "
            f"match the quantization method specified in the `quantization` argument "
            f"({deployment.quantization}).",
        )
    if quant is None:
        return None
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
    return quant


def _max_model_len(config: ServeConfig, model: ModelSpec) -> int:
    """The maximum model length asked for, or the checkpoint's; longer than the checkpoint's is refused."""
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
    return max_model_len


def _notes(deployment: Deployment, config: ServeConfig, gpu: GPU, model: ModelSpec, version: Version,
           dtype: str, backend: str, v1: bool) -> list[str]:
    """What the attention backend cannot run (refused), and the warnings vLLM would log with
    our approximations beside them."""
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
    if gpu.cc < 75 and version >= NO_SM70_WHEELS_SINCE:
        notes.append("vLLM's official wheels from 0.20 (torch 2.11, CUDA >= 12.8) ship no sm_70 kernels; a V100 "
                     "needs a build against CUDA < 12.8 (first release affected taken to be 0.20.0, not verified)")
    if model.sliding_window and model.model_type.startswith(("gemma2", "gemma3", "mistral")):
        notes.append(f"sliding-window layers (window {model.sliding_window}) are planned as full "
                     "attention: V1's hybrid allocator would hold more tokens")
    return notes


def _resolved(config: ServeConfig, gpu: GPU, version: Version, v1: bool, max_model_len: int,
              block_size: int) -> tuple[ServeConfig, int]:
    """``config`` with utilization, lengths, batch limits and block size resolved to what vLLM
    runs (``engine/arg_utils.py``), and the version's default token budget; the batch limits
    vLLM refuses raise."""
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
    if config.max_num_batched_tokens is None and config.enable_chunked_prefill is False:
        max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)  # a whole prompt fits one step
    if max_num_batched_tokens < max_num_seqs:
        raise ConfigRejected(
            "batch_tokens",
            f"max_num_batched_tokens ({max_num_batched_tokens}) must be greater than or equal "
            f"to max_num_seqs ({max_num_seqs}).",
        )
    one_step = config.enable_chunked_prefill is False or not v1 and max_model_len <= 32768  # prompts not split
    if one_step and max_num_batched_tokens < max_model_len:
        raise ConfigRejected(
            "batch_tokens",
            f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than max_model_len "
            f"({max_model_len}). This effectively limits the maximum sequence length to "
            "max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
            "max_num_batched_tokens or decrease max_model_len.",
        )
    resolved = config.replace(
        gpu_memory_utilization=config.gpu_memory_utilization or default_gpu_memory_utilization(version),
        max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, block_size=block_size)
    return resolved, default_tokens


def _memory(deployment: Deployment, config: ServeConfig, gpu: GPU, model: ModelSpec, quant: str | None,
            dtype: str, v1: bool, version: Version, default_tokens: int) -> dict[str, Any]:
    """The bytes of one TP rank (the plan's ``*_bytes`` fields): budget, weights, the profile
    run's activations, memory outside torch, CUDA graphs and what is left for the KV cache."""
    dtype_bytes = 4 if dtype == "float32" else 2
    tp, eager = config.tensor_parallel_size, config.enforce_eager
    emp = empirical_for(deployment)
    weights = model.weight_bytes_per_rank(quant, tp)
    if dtype_bytes == 4 and quant is None:
        weights *= 2
    # the step timer keeps the bytes its constants were fitted with (one overhead for all shapes)
    step_weights = weights + int(emp["weight_overhead_bytes"])
    weights += weight_overhead(emp, deployment.model)
    budget = math.ceil(gpu.memory_bytes * config.gpu_memory_utilization)
    hidden = model.hidden_size
    compile_term = 0.0 if eager else float(emp["compile_bytes_per_vocab_hidden"])
    tokens = activation_tokens(config.max_num_batched_tokens, default_tokens, eager, compile_term)
    activations = int(
        emp["activation_fixed_bytes"]
        + tokens * hidden * _activation_slope(emp, eager)
        # the vocabulary-parallel embedding's shard per rank (no TP > 1 start measured)
        + model.vocab_size // tp * hidden * compile_term
        + config.max_num_seqs * model.vocab_size * emp["sampler_bytes_per_logit"]
        + (tokens * model.num_experts_per_tok * hidden
           * emp["moe_activation_bytes_per_token_per_hidden"] if model.is_moe else 0)
    )
    non_torch = int(emp["non_torch_bytes"] + (emp["non_torch_tp_bytes"] if tp > 1 else 0))
    if not v1:
        non_torch += int(emp["cuda_context_bytes"])
    graphs = 0
    if not eager and version >= CUDAGRAPH_ESTIMATE_SINCE:
        graphs = int(emp["cudagraph_bytes_per_layer_per_size"] * model.num_layers
                     * _cudagraph_sizes(config.max_num_seqs))
    kv_dtype_bytes = 1 if config.kv_cache_dtype.startswith("fp8") else dtype_bytes
    return dict(
        kv_cache_dtype_bytes=kv_dtype_bytes, budget_bytes=budget, weight_bytes=weights,
        activation_bytes=activations, non_torch_bytes=non_torch, cudagraph_bytes=graphs,
        kv_bytes=budget - weights - activations - non_torch - int(graphs * emp["cudagraph_kv_fraction"]),
        page_bytes=config.block_size * model.kv_bytes_per_token(tp, kv_dtype_bytes),
        step_weight_bytes=step_weights,
    )


def _refusal(kv_bytes: int, page_bytes: int, config: ServeConfig, v1: bool) -> ConfigRejected | None:
    """vLLM's refusal for memory, in its words: no memory for the cache, or not enough for one
    request of max-model-len (V0 checked the block count, ``worker.py::raise_if_cache_size_invalid``;
    V1 the bytes); None when it starts."""
    max_model_len, block_size = config.max_model_len, config.block_size
    if kv_bytes <= 0 or (not v1 and kv_bytes < page_bytes):
        if not v1:
            msg = ("No available memory for the cache blocks. Try increasing "
                   "`gpu_memory_utilization` when initializing the engine.")
        else:
            msg = ("No available memory for the cache blocks. Try increasing "
                   "`gpu_memory_utilization` when initializing the engine (this flag also "
                   "controls CPU memory reservation on the CPU backend, despite its name). "
                   + _DOCS)
        return ConfigRejected("no_kv_memory", msg)
    needed = math.ceil(max_model_len / block_size) * page_bytes
    if not v1:
        capacity = kv_bytes // page_bytes * block_size
        if max_model_len <= capacity:
            return None
        return ConfigRejected(
            "max_model_len",
            f"The model's max seq len ({max_model_len}) is larger than the maximum number of "
            f"tokens that can be stored in KV cache ({capacity}). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine.",
            estimated_max_model_len=capacity,
        )
    if needed <= kv_bytes:
        return None
    estimate = _estimate_max_model_len(kv_bytes, block_size, page_bytes, max_model_len)
    return ConfigRejected(
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
    )


def _with_blocks(facts: dict[str, Any], num_blocks: int, error: ConfigRejected | None) -> MemoryPlan:
    """The plan of ``facts`` with ``num_blocks`` KV blocks: the tokens they hold and how many
    requests of max-model-len fit at once."""
    config = facts["config"]
    per_req = math.ceil(config.max_model_len / config.block_size)
    concurrency = num_blocks / per_req if num_blocks > 0 else 0.0
    return MemoryPlan(**facts, num_gpu_blocks=num_blocks, max_concurrency=concurrency,
                      kv_cache_tokens=int(concurrency * config.max_model_len), error=error)

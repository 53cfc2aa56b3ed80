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

The package, one module per noun: ``planner`` (:func:`plan_memory`), ``plan``
(:class:`MemoryPlan`), ``empirical`` (:data:`EMPIRICAL` and its overrides), ``defaults``
(vLLM's defaults by version and GPU) and ``support`` (dtype, quantisation, attention backend
and block size checks). Every public name is imported here.
"""
from __future__ import annotations

from tuner.sim.memory.defaults import (
    CUDAGRAPH_ESTIMATE_SINCE,
    GMU_092_SINCE,
    SEQS_1024_SINCE,
    V1_PRE_AMPERE_SINCE,
    V1_SINCE,
    default_batch_limits,
    default_gpu_memory_utilization,
    uses_v1_engine,
)
from tuner.sim.memory.empirical import EMPIRICAL, MiB, activation_tokens, empirical_for
from tuner.sim.memory.plan import MemoryPlan, fmt_gib
from tuner.sim.memory.planner import plan_memory
from tuner.sim.memory.support import (
    BF16_FALLBACK_SINCE,
    FLASH_ATTN_V0_HEAD_SIZES,
    MIN_CAPABILITY,
    MIN_CAPABILITY_BEFORE_TURING_MARLIN,
    PAGED_ATTENTION_HEAD_SIZES,
    TURING_MARLIN_SINCE,
    XFORMERS_SOFTCAP_WARNS_SINCE,
    attention_backend,
    check_attention,
    check_block_size,
    resolve_dtype,
)

__all__ = [
    "MiB",
    "EMPIRICAL",
    "empirical_for",
    "MIN_CAPABILITY",
    "MIN_CAPABILITY_BEFORE_TURING_MARLIN",
    "TURING_MARLIN_SINCE",
    "BF16_FALLBACK_SINCE",
    "XFORMERS_SOFTCAP_WARNS_SINCE",
    "PAGED_ATTENTION_HEAD_SIZES",
    "GMU_092_SINCE",
    "CUDAGRAPH_ESTIMATE_SINCE",
    "V1_SINCE",
    "V1_PRE_AMPERE_SINCE",
    "SEQS_1024_SINCE",
    "fmt_gib",
    "MemoryPlan",
    "default_gpu_memory_utilization",
    "uses_v1_engine",
    "activation_tokens",
    "default_batch_limits",
    "resolve_dtype",
    "FLASH_ATTN_V0_HEAD_SIZES",
    "attention_backend",
    "check_attention",
    "check_block_size",
    "plan_memory",
]

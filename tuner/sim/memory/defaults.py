"""vLLM's defaults by version and GPU: which engine runs (:func:`uses_v1_engine`), the
default ``gpu_memory_utilization`` and batch limits, and the releases they changed in."""
from __future__ import annotations

from tuner.sim.hardware import GPU, GiB

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


def default_gpu_memory_utilization(version: tuple[int, int, int]) -> float:
    return 0.92 if version >= GMU_092_SINCE else 0.9


def uses_v1_engine(gpu: GPU, version: tuple[int, int, int]) -> bool:
    return version >= V1_SINCE and (gpu.cc >= 80 or version >= V1_PRE_AMPERE_SINCE)


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

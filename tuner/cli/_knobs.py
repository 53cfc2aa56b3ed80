"""The deployment and vLLM knobs that ``tuner estimate`` and ``tuner plan`` both take as
flags, turned into one :class:`Deployment` and :class:`ServeConfig`. Each command keeps its
own option declarations (their defaults and help differ: estimate has concrete defaults,
plan uses None for "not given") and resolves its defaults before calling this."""
from __future__ import annotations

from tuner.config import Deployment, ServeConfig


def build_deployment_config(
    *, model: str, gpu: str, gpu_count: int, gpu_ids: tuple[int, ...] = (), vllm_version: str,
    dtype: str, quantization: str | None, tp: int, replicas: int,
    gpu_memory_utilization: float | None, max_model_len: int | None, max_num_seqs: int | None,
    block_size: int | None, max_num_batched_tokens: int | None, enforce_eager: bool,
    kv_cache_dtype: str, prefix_caching: bool,
) -> tuple[Deployment, ServeConfig]:
    """The machine (``--gpu``, ``--gpus``, ``--model``, ...) and the ``vllm serve`` flags
    (``--tp``, ``--max-num-seqs``, ...) as the two objects the simulator and backends take;
    ``None`` knobs mean vLLM's default for the version, GPU and model."""
    deployment = Deployment(
        model=model, gpu=gpu, gpu_count=gpu_count, gpu_ids=gpu_ids, vllm_version=vllm_version,
        dtype=dtype, quantization=quantization,
    )
    config = ServeConfig(
        gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=prefix_caching,
        enforce_eager=enforce_eager, kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=tp,
        replicas=replicas,
    )
    return deployment, config

"""What vLLM decides at startup for one engine: :class:`MemoryPlan`, its startup lines in
vLLM's wording and its summary; :func:`fmt_gib`, vLLM's GiB format."""
from __future__ import annotations

from dataclasses import dataclass

from tuner.core.errors import ConfigRejected, InputError
from tuner.sim.hardware import GPU, GiB
from tuner.sim.model import ModelSpec


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
    long_prefill_token_threshold: int = 0  # vLLM's scheduler cap on one request's prefill per step (0: none)
    api_server_count: int = 1             # API server processes per replica (--api-server-count)
    attention_backend: str = ""
    engine: str = "V1"                    # "V0" for vLLM < 0.8, or < 0.10.2 below CC 8.0
    notes: tuple[str, ...] = ()           # warnings vLLM would log, and our approximations
    # the weight bytes the step-time constants were fitted with (the parameters plus the profile's
    # one load overhead for every shape, weight_overhead_bytes); None: weight_bytes
    step_weight_bytes: int | None = None
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

"""What vLLM decides at startup for one engine: :class:`MemoryPlan`, its startup lines in
vLLM's wording and its summary; :func:`fmt_gib`, vLLM's GiB format."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tuner.core.errors import ConfigRejected, InputError
from tuner.serving.config import ServeConfig
from tuner.sim.hardware import GPU, GiB
from tuner.sim.model import ModelSpec

_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(ServeConfig))


def fmt_gib(n: float) -> str:
    """vLLM's ``format_gib``: GiB rounded to 2 decimals ("1.75 GiB", "3.0 GiB")."""
    return f"{round(n / GiB, 2)} GiB"


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """What vLLM decides at startup for one engine (one replica; figures per TP rank), for the
    configuration it runs (:attr:`config`: a knob's value is read there, never copied here)."""

    gpu: GPU
    model: ModelSpec
    #: the configuration vLLM runs: the trial's, with the knobs it left unset (``None``) resolved
    #: to the version's defaults where the plan needs their value (utilization, lengths, batch
    #: limits, block size); the others keep ``None``, vLLM's default (:attr:`ServeConfig` docs)
    config: ServeConfig
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

    def replace(self, **changes: Any) -> MemoryPlan:
        """A copy with ``changes``; a knob's name (a :class:`ServeConfig` field) changes the
        plan's :attr:`config` (what-ifs and tests: a real plan with a smaller pool, another
        threshold)."""
        knobs = {k: changes.pop(k) for k in list(changes) if k in _CONFIG_FIELDS}
        if knobs:
            changes["config"] = self.config.replace(**knobs)
        return dataclasses.replace(self, **changes)

    def log_lines(self) -> list[str]:
        """The startup lines vLLM logs, in vLLM's wording (V1)."""
        lines = [f"Model loading took {fmt_gib(self.weight_bytes)} memory"]
        if self.error is not None:
            return lines + [self.error.message]
        lines.append(f"Available KV cache memory: {fmt_gib(self.kv_bytes)}")
        if not self.v1:
            return lines + [
                f"# GPU blocks: {self.num_gpu_blocks}, # CPU blocks: 0",
                f"Maximum concurrency for {self.config.max_model_len} tokens per request: "
                f"{self.max_concurrency:.2f}x",
            ]
        lines.append(
            f"GPU KV cache size: {self.kv_cache_tokens:,} tokens, Maximum concurrency for "
            f"{self.config.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
        )
        if not self.config.enforce_eager and self.cudagraph_bytes:
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
            **self.config.to_dict(),
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

"""The vLLM knobs of one trial (:class:`ServeConfig`) and what stays fixed during a
study (:class:`Deployment`).

``None`` in a :class:`ServeConfig` field means "leave vLLM's default": the memory
planner and the argv renderer resolve defaults for the vLLM version at hand.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import InputError

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
DTYPES = ("auto", "float16", "half", "bfloat16", "float32")
QUANTIZATIONS = (None, "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors")

#: vLLM version assumed when none is given (the newest line the simulator follows).
DEFAULT_VLLM_VERSION = "0.26.0"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """One point of the search space: the flags a trial passes to ``vllm serve``."""

    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        gmu = self.gpu_memory_utilization
        if gmu is not None and not 0.0 < gmu <= 1.0:
            raise InputError(
                f"gpu_memory_utilization must be in (0, 1], got {gmu}",
                hint="vLLM takes a fraction of total GPU memory, e.g. 0.9",
            )
        for name in ("max_num_seqs", "max_model_len", "block_size", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        if self.tensor_parallel_size < 1 or self.replicas < 1:
            raise InputError(
                f"tensor_parallel_size and replicas must be >= 1, got "
                f"{self.tensor_parallel_size} x {self.replicas}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InputError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}"
            )

    @property
    def gpus_needed(self) -> int:
        return self.tensor_parallel_size * self.replicas

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServeConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InputError(
                f"unknown ServeConfig field(s): {', '.join(unknown)}",
                hint=f"known: {', '.join(sorted(names))}",
            )
        return cls(**data)

    def replace(self, **changes: Any) -> ServeConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Deployment:
    """What is fixed during a study: model, GPUs, vLLM version, precision.

    ``model`` is a preset name (see ``tuner.sim.model.PRESETS``) or a local folder
    holding a Hugging Face ``config.json``. ``gpu`` is a catalog name
    (``tuner.sim.hardware``). ``gpu_ids`` lists device ids for the vLLM backend
    (``CUDA_VISIBLE_DEVICES``); when empty, ``range(gpu_count)`` is used.
    """

    model: str = "qwen2.5-7b"
    gpu: str = "H100-SXM"
    gpu_count: int = 1
    vllm_version: str = DEFAULT_VLLM_VERSION
    dtype: str = "auto"
    quantization: str | None = None
    gpu_ids: tuple[int, ...] = field(default=())
    calibration: str | None = None

    def __post_init__(self) -> None:
        if self.gpu_count < 1:
            raise InputError(f"gpu_count must be >= 1, got {self.gpu_count}")
        if self.dtype not in DTYPES:
            raise InputError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise InputError(
                f"quantization {self.quantization!r} is not one of "
                f"{', '.join(q for q in QUANTIZATIONS if q)}"
            )
        if self.gpu_ids and len(self.gpu_ids) != self.gpu_count:
            raise InputError(
                f"{len(self.gpu_ids)} GPU ids given for gpu_count {self.gpu_count}"
            )

    @property
    def devices(self) -> tuple[int, ...]:
        return self.gpu_ids or tuple(range(self.gpu_count))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["gpu_ids"] = list(self.gpu_ids)
        return data

    def label(self) -> str:
        """Short human label, also used in study names: ``8xV100-32GB-SXM2.qwen2.5-7b``."""
        model = self.model.rstrip("/").rsplit("/", 1)[-1]
        quant = f".{self.quantization}" if self.quantization else ""
        return f"{self.gpu_count}x{self.gpu}.{model}{quant}"

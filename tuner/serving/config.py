"""The vLLM knobs of one trial (:class:`ServeConfig`) and what stays fixed during a
study (:class:`Deployment`).

``None`` in a :class:`ServeConfig` field means "leave vLLM's default": the memory
planner and the argv renderer resolve defaults for the vLLM version at hand.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from tuner.core.errors import InputError
from tuner.core.knobs import KNOBS, knob
from tuner.core.values import is_int, is_number, shown

KV_CACHE_DTYPES = knob("kv_cache_dtype").choices
DTYPES = ("auto", "float16", "half", "bfloat16", "float32")
QUANTIZATIONS = (None, "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors")

#: vLLM version assumed when none is given (the newest line the simulator follows).
DEFAULT_VLLM_VERSION = "0.26.0"

# The ranges tuner plans for. A value outside them is a typo (an extra zero, bytes where
# tokens belong) that would otherwise cost minutes or gigabytes before the first trial.
#: GPUs in one deployment (and the most a TP group or a replica count can use): well above
#: the largest fleets one study tunes, small enough that every layout list stays short.
MAX_GPUS = 4096
#: The whole-number knobs' ranges (from 1; :data:`tuner.core.knobs.KNOBS`, with MAX_TOKENS, MAX_NUM_SEQS,
#: MAX_BLOCK_SIZE) and the layout's.
_INT_LIMITS = {
    **{k.name: k.high for k in KNOBS if k.type is int},
    "tensor_parallel_size": MAX_GPUS,
    "replicas": MAX_GPUS,
}
_VERSION_RE = re.compile(r"\s*v?\d{1,6}(\.\d{1,6}){0,2}\b")


def _known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as keyword arguments of dataclass ``cls``; InputError naming unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise InputError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}",
                         hint=f"known: {', '.join(sorted(names))}")
    return dict(data)


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """One point of the search space: the flags a trial passes to ``vllm serve``."""

    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    kv_cache_dtype: str = "auto"
    api_server_count: int | None = None
    tensor_parallel_size: int = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        gmu = self.gpu_memory_utilization
        if gmu is not None and not (is_number(gmu) and 0.0 < gmu <= 1.0):
            raise InputError(
                f"gpu_memory_utilization must be in (0, 1], got {shown(gmu)}",
                hint="vLLM takes a fraction of total GPU memory, e.g. 0.9",
            )
        for name in (k.name for k in KNOBS if k.type is int):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or not 1 <= value <= _INT_LIMITS[name]):
                raise InputError(
                    f"{name} must be an integer in 1-{_INT_LIMITS[name]:,}, got {shown(value)}",
                    hint=None if not is_int(value) or value < 1 else "larger is more than tuner plans for",
                )
        tp, replicas = self.tensor_parallel_size, self.replicas
        if not (is_int(tp) and is_int(replicas) and tp >= 1 and replicas >= 1):
            raise InputError(
                f"tensor_parallel_size and replicas must be >= 1, got {shown(tp)} x {shown(replicas)}"
            )
        if tp > MAX_GPUS or replicas > MAX_GPUS:
            raise InputError(
                f"layout tp{tp}x{replicas} uses more GPUs than tuner plans for (1-{MAX_GPUS})"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InputError(
                f"kv_cache_dtype {shown(self.kv_cache_dtype)} is not one of {', '.join(KV_CACHE_DTYPES)}"
            )

    @property
    def gpus_needed(self) -> int:
        return self.tensor_parallel_size * self.replicas

    def to_dict(self) -> dict[str, Any]:
        """Every field, but a knob that only some vLLM lines have (its row's ``since``) only when
        set: a configuration reads the same before and after tuner learns a knob (records,
        copies and twins found by their configuration, studies resumed across versions)."""
        data = dataclasses.asdict(self)
        for k in KNOBS:
            if k.since is not None and data.get(k.name) is None:
                del data[k.name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServeConfig:
        return cls(**_known_fields(cls, data))

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
        for name in ("model", "gpu"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InputError(f"{name} must be a name, got {shown(value)}")
        if not is_int(self.gpu_count) or self.gpu_count < 1:
            raise InputError(f"gpu_count must be a whole number of GPUs >= 1, got {shown(self.gpu_count)}")
        if self.gpu_count > MAX_GPUS:
            raise InputError(
                f"{self.gpu_count} GPUs is more than tuner plans for (1-{MAX_GPUS})",
                hint="gpus counts GPUs, not GPU memory or device ids",
            )
        if not isinstance(self.vllm_version, str) or not _VERSION_RE.match(self.vllm_version):
            raise InputError(
                f"vllm_version must be a version such as \"{DEFAULT_VLLM_VERSION}\", got {shown(self.vllm_version)}",
                hint="quote it in YAML: 0.10 would read as the number 0.1",
            )
        if self.dtype not in DTYPES:
            raise InputError(f"dtype {shown(self.dtype)} is not one of {', '.join(DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise InputError(
                f"quantization {shown(self.quantization)} is not one of "
                f"{', '.join(q for q in QUANTIZATIONS if q)}"
            )
        if self.calibration is not None and (not isinstance(self.calibration, str) or not self.calibration):
            raise InputError(f"calibration must be the path of a profile YAML, got {shown(self.calibration)}")
        if not isinstance(self.gpu_ids, tuple) or not all(
                is_int(i) and 0 <= i < MAX_GPUS for i in self.gpu_ids):
            raise InputError(
                f"gpu_ids must be device ids 0-{MAX_GPUS - 1}, got {shown(self.gpu_ids)}",
                hint="e.g. gpu_ids: [0, 1, 2, 3]",
            )
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise InputError(f"gpu_ids {shown(list(self.gpu_ids))} names a device twice")
        if self.gpu_ids and len(self.gpu_ids) != self.gpu_count:
            raise InputError(
                f"{len(self.gpu_ids)} GPU ids given for gpu_count {self.gpu_count}"
            )

    @property
    def devices(self) -> tuple[int, ...]:
        return self.gpu_ids or tuple(range(self.gpu_count))

    def idle_devices(self, tensor_parallel_size: int, replicas: int) -> tuple[int, ...]:
        """The devices a layout leaves unused (replica ``k`` runs on ``devices[k*tp:(k+1)*tp]``)."""
        return self.devices[tensor_parallel_size * replicas:]

    def idle_note(self, tensor_parallel_size: int, replicas: int) -> str | None:
        """One line naming the GPUs the layout leaves idle (None when it uses them all):
        ``TP2 x 1 replica uses 2 of the 3 GPUs (0,1), GPU 2 sits idle``."""
        idle = self.idle_devices(tensor_parallel_size, replicas)
        if not idle:
            return None
        used = self.devices[:tensor_parallel_size * replicas]
        ids = lambda ds: ",".join(map(str, ds))  # noqa: E731
        return (f"TP{tensor_parallel_size} x {replicas} replica{'s' if replicas > 1 else ''} uses {len(used)} of "
                f"the {self.gpu_count} GPUs ({ids(used)}), "
                + (f"GPU {idle[0]} sits idle" if len(idle) == 1 else f"GPUs {ids(idle)} sit idle"))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["gpu_ids"] = list(self.gpu_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Deployment:
        """From :meth:`to_dict` (``gpu_ids`` as a list, as JSON keeps it)."""
        kw = _known_fields(cls, data)
        kw["gpu_ids"] = tuple(kw.get("gpu_ids") or ())
        return cls(**kw)

    def label(self) -> str:
        """Short human label, also used in study names: ``8xV100-32GB-SXM2.qwen2.5-7b``."""
        model = self.model.rstrip("/").rsplit("/", 1)[-1]
        quant = f".{self.quantization}" if self.quantization else ""
        return f"{self.gpu_count}x{self.gpu}.{model}{quant}"

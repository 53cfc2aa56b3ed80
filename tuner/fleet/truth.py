"""What is true of a GPU kind before any prediction: which vLLM lines run on it (:func:`lines_for`),
what vLLM refuses there for the fleet's model, in vLLM's own words and in the order vLLM checks
(:func:`refusals`), what the box can serve instead (:func:`serves_instead`), and the physical
ceilings a prediction must stay under (:func:`ceiling`).

The facts per vLLM line (sources in :data:`LINES`; vllm-facts.md section 4 for the quantisation
minimums, bf16 and the attention backends, which :mod:`tuner.sim.memory.support` holds):

* compute capability 7.0 (V100): official wheels up to the 0.19 line (docs: "compute capability
  7.0 or higher (e.g., V100, T4, ...)"), none from 0.20 (torch 2.11: no sm_70 in CUDA >= 12.8);
  the V0 engine with XFormers attention before 0.10.2, V1 with TRITON_ATTN from it;
* 7.5 (T4): every line; 8.0+ (A100, L4, 4090, H100): FLASH_ATTN; bf16 from 8.0; native FP8
  (W8A8) from 8.9, weight-only FP8 via Marlin below; AWQ from 7.5, GPTQ from 6.0.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.core.errors import ConfigRejected
from tuner.core.versions import parse_version
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.hardware import get_gpu
from tuner.sim.memory import plan_memory
from tuner.sim.memory.defaults import uses_v1_engine
from tuner.sim.memory.support import MIN_CAPABILITY, NO_SM70_WHEELS_SINCE, attention_backend
from tuner.sim.model import load_model, preset_names

if TYPE_CHECKING:
    from tuner.sim.hardware import GPU
    from tuner.sim.memory import MemoryPlan

#: The vLLM line tuner calls current (what ``../shared/reference/vllm-facts.md`` was read from).
CURRENT = "0.33.0"


@dataclass(frozen=True, slots=True)
class VllmLine:
    """A line of vLLM releases: a representative release, the lowest compute capability its
    official wheels carry kernels for, and where that comes from."""

    name: str
    version: str
    min_cc: int
    source: str


LINES = (
    VllmLine("0.6.x", "0.6.3", 70, "docs v0.6.1: 'compute capability 7.0 or higher (e.g., V100, T4, RTX20xx, A100, "
             "L4, H100, etc.)', CUDA 11.8/12.1 wheels (docs.vllm.ai/en/v0.6.1.post2/getting_started/installation)"),
    VllmLine("0.8.0-0.10.1", "0.9.2", 70, "V1 the default from 0.8.0 on compute capability 8.0+, V0 below it"),
    VllmLine("0.10.2-0.19.x", "0.14.0", 70, "V1 below compute capability 8.0 from 0.10.2 (vllm#23614, #24022); "
             "docs v0.14.0: 'compute capability 7.0 or higher', CUDA 12.8 binaries"),
    VllmLine("0.20.0+", CURRENT, 75, "torch 2.11 from 0.20 (vllm-omni#2704): PyTorch 2.11's CUDA >= 12.8 builds "
             "dropped Volta (pytorch#172352); cu129/cu130 wheels only (vllm#42756); current docs: 7.5 or higher"),
)


@dataclass(frozen=True, slots=True)
class LineSupport:
    """Whether a vLLM line's official wheels run on the GPU, with which engine and attention."""

    line: str
    runs: bool
    engine: str
    attention: str
    source: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refusal: the vLLM version, the check (``wheels``, ``quantization``, ``dtype``,
    ``memory`` ...), what was tried and vLLM's own message."""

    vllm_version: str
    check: str
    tried: str
    message: str


@dataclass(frozen=True, slots=True)
class Ceiling:
    """Physical limits of one engine: weights per GPU, one stream's decode (bandwidth over the
    bytes each step reads: article 000's 900 GB/s / 14.5 GB = 62 tok/s) and the engine's
    tokens/s if every FLOP went to the model (2 x active parameters a token)."""

    tp: int
    weights_gib: float
    decode_tokens_per_s: float
    compute_tokens_per_s: float


def wheels_run(gpu: GPU, version: str) -> bool:
    """Whether the official wheels of ``version`` carry kernels for the GPU."""

    return not (gpu.cc < 75 and parse_version(version) >= NO_SM70_WHEELS_SINCE) and gpu.cc >= 70


def lines_for(gpu: GPU, head_dim: int = 128) -> tuple[LineSupport, ...]:
    """Each vLLM line on ``gpu``: whether its wheels run, the engine and attention backend."""

    out = []
    for line in LINES:
        version = parse_version(line.version)
        runs = wheels_run(gpu, line.version)
        out.append(LineSupport(line.name, runs, ("V1" if uses_v1_engine(gpu, version) else "V0") if runs else "-",
                               attention_backend(gpu, version, "auto", head_dim) if runs else "-", line.source))
    return tuple(out)


def _wheel_message(gpu: GPU, version: str) -> str:
    return (f"the official wheels carry no kernels for compute capability "
            f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]} ({gpu.torch_name}): the first CUDA call fails "
            "with 'no kernel image is available for execution on the device' (use 0.19.x or older, or build "
            "against CUDA < 12.8)")


def _gptq_twin(dep: Deployment) -> Deployment | None:
    """The same model in GPTQ int4: its ``-gptq`` preset, or GPTQ weights of a 16-bit checkpoint."""

    if dep.model.endswith("-awq"):
        twin = dep.model[: -len("-awq")] + "-gptq"
        return dataclasses.replace(dep, model=twin, quantization=None) if twin in preset_names() else None
    return None if load_model(dep.model).quantization else dataclasses.replace(dep, quantization="gptq")


def _tried(dep: Deployment, cfg: ServeConfig) -> str:

    quant = dep.quantization or load_model(dep.model).quantization or "16-bit"
    return (f"{dep.model} ({quant} weights, dtype {dep.dtype}), TP {cfg.tensor_parallel_size}, gpu-memory-utilization "
            f"{cfg.gpu_memory_utilization}, max-model-len {cfg.max_model_len}"
            + (", eager" if cfg.enforce_eager else ""))


def refusals(dep: Deployment, cfg: ServeConfig, versions: tuple[str, ...]) -> tuple[Refusal, ...]:
    """What each of ``versions`` refuses for ``cfg`` on ``dep``, in the order vLLM checks:
    the wheels, then the planner's checks (quantisation, dtype, attention, memory). A
    quantisation refused is tried again with the next method that runs there (AWQ -> GPTQ:
    the same 4-bit arithmetic, minimum capability 6.0) to show what would refuse next."""

    gpu, out = get_gpu(dep.gpu), []
    for version in dict.fromkeys(versions):
        d = dataclasses.replace(dep, vllm_version=version)
        if not wheels_run(gpu, version):
            out.append(Refusal(version, "wheels", f"vLLM {version} on {gpu.name}", _wheel_message(gpu, version)))
        for _ in range(2):
            try:
                plan = plan_memory(d, cfg, strict=False)
            except ConfigRejected as err:
                out.append(Refusal(version, err.kind, _tried(d, cfg), err.message))
                twin = _gptq_twin(d) if err.kind == "quantization" and "awq" in str(err.message) else None
                if twin is None:
                    break
                d = twin
                continue
            if plan.error is not None:
                out.append(Refusal(version, "memory", _tried(d, cfg) + f": {_arithmetic(plan)}", plan.error.message))
            break
    return tuple(out)


def _arithmetic(plan: MemoryPlan) -> str:
    gib = 2**30
    return (f"{plan.gpu.memory_gib:.2f} GiB x {plan.config.gpu_memory_utilization} = {plan.budget_bytes / gib:.2f} GiB "
            f"budget, {plan.weight_bytes / gib:.2f} GiB of weights, {plan.activation_bytes / gib:.2f} GiB of "
            f"activations, {plan.non_torch_bytes / gib:.2f} GiB outside torch: {plan.kv_bytes / gib:.2f} GiB left "
            "for the KV cache")


def serves_instead(dep: Deployment, cfg: ServeConfig) -> str | None:
    """The largest shipped model preset that starts on ``dep``'s GPU and version with ``cfg``
    and holds at least one max-length request (16-bit, or GPTQ int4 where it is not already
    quantised), as a line; None when none does."""

    best: tuple[int, str] | None = None
    for name in preset_names():
        model = load_model(name)
        for quant in ((None,) if model.quantization else (None, "gptq")):
            d = dataclasses.replace(dep, model=name, quantization=quant, dtype="float16")
            try:
                plan = plan_memory(d, dataclasses.replace(cfg, max_model_len=min(cfg.max_model_len or 4096,
                                                                                  model.max_position_embeddings)))
            except ConfigRejected:
                continue
            if best is None or model.param_count() > best[0]:
                best = (model.param_count(), f"{name}{' (GPTQ int4)' if quant else ''}: "
                        f"{plan.weight_bytes / 2**30:.1f} GiB of weights, {plan.kv_cache_tokens:,} KV tokens at "
                        f"max-model-len {plan.config.max_model_len:,}")
    return None if best is None else best[1]


def ceiling(plan: MemoryPlan) -> Ceiling:
    """The physical ceilings of the engine ``plan`` describes."""
    read = plan.step_weight_bytes or plan.weight_bytes
    tp = plan.config.tensor_parallel_size
    return Ceiling(tp=tp, weights_gib=plan.weight_bytes / 2**30, decode_tokens_per_s=plan.gpu.hbm_bandwidth / read,
                   compute_tokens_per_s=tp * plan.gpu.fp16_flops / (2.0 * plan.model.active_param_count()))


def facts(gpu: GPU) -> dict[str, Any]:
    """bf16, FP8 and the quantisation methods on this GPU (current vLLM's minimums)."""

    cc = f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}"
    fp8 = ("native W8A8" if gpu.cc >= 89 else "weight-only (Marlin)" if gpu.cc >= 75 else "no")
    quant = {m: ("yes" if gpu.cc >= need else f"needs {need // 10}.{need % 10}")
             for m, need in MIN_CAPABILITY.items() if m in ("awq", "gptq", "fp8")}
    return {"compute_capability": cc, "bf16": gpu.bf16, "fp8": fp8, "quantization": quant}


__all__ = ["CURRENT", "LINES", "Ceiling", "LineSupport", "Refusal", "VllmLine", "ceiling", "facts", "lines_for",
           "refusals", "serves_instead", "wheels_run"]

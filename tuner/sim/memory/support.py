"""What a GPU and vLLM version support, in vLLM's words where it refuses: the dtype
(:func:`resolve_dtype`), the quantisation methods' minimum compute capability, the attention
backend (:func:`attention_backend`, :func:`check_attention`) and the block size
(:func:`check_block_size`)."""
from __future__ import annotations

from tuner.core.errors import ConfigRejected
from tuner.serving.config import Deployment
from tuner.sim.hardware import GPU
from tuner.sim.memory.defaults import uses_v1_engine
from tuner.sim.model import ModelSpec

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
#: The first vLLM line whose official wheels carry no sm_70 (V100) kernels, taken to be 0.20.0,
#: the first on torch 2.11 (vllm-project/vllm-omni#2704, tenstorrent/tt-xla#5559): PyTorch 2.11
#: dropped Volta from its CUDA >= 12.8 builds (pytorch/pytorch#172352), and vLLM ships cu129 and
#: cu130 wheels only (vllm-project/vllm#42756). Not verified in a wheel; 0.14.0's docs still read
#: "compute capability 7.0 or higher (e.g., V100, ...)", the current ones 7.5.
NO_SM70_WHEELS_SINCE = (0, 20, 0)
#: Head sizes V0's PagedAttention kernels (the XFormers backend) take, vLLM 0.6.6.post1
#: (attention/ops/paged_attn.py::get_supported_head_sizes).
PAGED_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 120, 128, 192, 256)


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

"""Model shapes from a Hugging Face ``config.json``, and named presets.

:func:`load_model` takes a preset name (``qwen2.5-7b``; see :data:`PRESETS`) or a
folder holding ``config.json`` (Llama, Qwen2/2.5/3, Mistral, Gemma 2/3 including
Gemma 3's ``text_config`` nesting, Mixtral/Qwen MoE). Parameter counts follow the
modules vLLM builds for these architectures; weight bytes follow the quantisation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError

#: Weight-only int4 methods (AWQ, GPTQ and their Marlin kernels): 4-bit weights plus one
#: fp16 scale and one packed zero point per group of ``group_size`` input channels.
INT4_METHODS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors")
FP16_NAMES = (None, "", "none", "fp16", "float16", "half", "bf16", "bfloat16", "auto")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as memory and step time care."""

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    torch_dtype: str = "bfloat16"
    max_position_embeddings: int = 32768
    quantization: str | None = None
    # Beyond the contract:
    model_type: str = ""
    attention_bias: bool = False          # Qwen2 has q/k/v biases
    qk_norm: bool = False                 # Qwen3, Gemma 3 normalise q and k per head
    norms_per_layer: int = 2              # Gemma 2/3 have 4 (pre/post attention and MLP)
    shared_expert_intermediate_size: int = 0
    quant_bits: int = 16
    quant_group_size: int = 128
    sliding_window: int | None = None
    attn_logit_softcapping: float | None = None   # Gemma 2: tanh soft cap of attention logits

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise InputError(f"model {self.name}: {field} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise InputError(
                f"model {self.name}: {self.num_heads} attention heads are not a multiple of "
                f"{self.num_kv_heads} KV heads"
            )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise InputError(
                f"model {self.name}: num_experts_per_tok {self.num_experts_per_tok} must be in "
                f"1..{self.num_experts}"
            )

    # ----------------------------------------------------------------- parameters
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def _attn_linear(self) -> int:
        h, hd = self.hidden_size, self.head_dim
        q = h * self.num_heads * hd
        kv = 2 * h * self.num_kv_heads * hd
        o = self.num_heads * hd * h
        return q + kv + o

    def _mlp_linear(self, experts: int) -> int:
        """Gated MLP (gate, up, down) per layer; MoE counts ``experts`` routed experts."""
        h = self.hidden_size
        if not self.is_moe:
            return 3 * h * self.intermediate_size
        routed = experts * 3 * h * self.moe_intermediate_size
        shared = 3 * h * self.shared_expert_intermediate_size
        return routed + shared

    def _layer_other(self) -> int:
        """Per-layer parameters outside the big matrices: biases, norms, router."""
        h, hd = self.hidden_size, self.head_dim
        n = self.norms_per_layer * h
        if self.attention_bias:
            n += (self.num_heads + 2 * self.num_kv_heads) * hd
        if self.qk_norm:
            n += 2 * hd
        if self.is_moe:
            n += h * self.num_experts            # router
            if self.shared_expert_intermediate_size:
                n += h                           # shared-expert gate (Qwen2-MoE)
        return n

    def embedding_params(self) -> int:
        """Input embedding plus the LM head when it is not tied."""
        one = self.vocab_size * self.hidden_size
        return one if self.tie_word_embeddings else 2 * one

    def linear_params(self, experts: int | None = None) -> int:
        """Parameters in the transformer's linear layers (what int4/fp8 quantise)."""
        e = self.num_experts if experts is None else experts
        return self.num_layers * (self._attn_linear() + self._mlp_linear(e))

    def param_count(self) -> int:
        """All parameters of the language model."""
        return (
            self.linear_params()
            + self.num_layers * self._layer_other()
            + self.embedding_params()
            + self.hidden_size  # final norm
        )

    def expert_params(self) -> int:
        """Parameters of all routed experts (0 for a dense model)."""
        if not self.is_moe:
            return 0
        return self.num_layers * self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size

    def expert_bytes(self, quantization: str | None = None) -> int:
        """Weight bytes of all routed experts (quantised like the other linear layers)."""
        return int(round(self.expert_params() * self.linear_bytes_per_param(quantization)))

    def active_expert_params(self) -> int:
        """Routed-expert parameters one token runs through (``num_experts_per_tok`` per layer)."""
        if not self.is_moe:
            return 0
        return self.num_layers * self.num_experts_per_tok * 3 * self.hidden_size * self.moe_intermediate_size

    def active_param_count(self) -> int:
        """Parameters touched per token: MoE models only run ``num_experts_per_tok`` experts."""
        if not self.is_moe:
            return self.param_count()
        return self.param_count() - self.linear_params() + self.linear_params(self.num_experts_per_tok)

    # ----------------------------------------------------------------- bytes
    def resolve_quantization(self, quantization: str | None) -> str | None:
        """The method in effect: the one asked for, else the checkpoint's own."""
        q = (quantization or "").lower() or None
        if q in ("fp16", "float16", "half", "bf16", "bfloat16", "auto", "none"):
            q = None
        return q or self.quantization

    def linear_bytes_per_param(self, quantization: str | None) -> float:
        q = self.resolve_quantization(quantization)
        if q is None:
            return 2.0
        if q == "fp8":
            return 1.0
        if q in INT4_METHODS or q == "bitsandbytes":
            bits = self.quant_bits if self.quant_bits < 16 else 4
            g = self.quant_group_size if self.quant_group_size > 0 else 128
            # AutoAWQ/AutoGPTQ layouts: packed `bits`-bit weights, an fp16 scale and a packed
            # `bits`-bit zero point per group of g input channels and output channel.
            return bits / 8 + (2 + bits / 8) / g
        raise InputError(
            f"unknown quantization {q!r}",
            hint="use one of fp8, awq, awq_marlin, gptq, gptq_marlin, compressed-tensors",
        )

    def weight_bytes(self, quantization: str | None = None) -> int:
        """Whole-model weight bytes. Quantised methods quantise the transformer's linear
        layers only; embeddings, LM head, norms, biases and MoE routers stay 16-bit."""
        linear = self.linear_params()
        other = self.param_count() - linear
        return int(round(linear * self.linear_bytes_per_param(quantization) + other * 2))

    def weight_bytes_per_rank(self, quantization: str | None, tp: int) -> int:
        """Bytes one tensor-parallel rank holds. Everything is sharded by ``tp`` except
        K/V projections once ``tp`` exceeds the KV heads: vLLM then replicates them so
        every rank has ``max(1, kv_heads // tp)`` heads."""
        total = self.weight_bytes(quantization)
        if tp <= 1:
            return total
        per_rank = total / tp
        if tp > self.num_kv_heads:
            kv_params = self.num_layers * 2 * self.hidden_size * self.num_kv_heads * self.head_dim
            kv_bytes = kv_params * self.linear_bytes_per_param(quantization)
            heads_per_rank = max(1, self.num_kv_heads // tp)
            per_rank += kv_bytes * heads_per_rank / self.num_kv_heads - kv_bytes / tp
        return int(per_rank)

    def kv_heads_per_rank(self, tp: int) -> int:
        """vLLM ``ModelConfig.get_num_kv_heads``: ``max(1, kv_heads // tp)`` (replicated
        when TP exceeds the KV heads)."""
        return max(1, self.num_kv_heads // max(1, tp))

    def kv_bytes_per_token(self, tp: int, kv_dtype_bytes: int) -> int:
        """KV cache bytes one token takes on one TP rank, all layers, K and V."""
        return self.num_layers * 2 * self.kv_heads_per_rank(tp) * self.head_dim * kv_dtype_bytes


# --------------------------------------------------------------------- parsing
def _int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise InputError(f"config.json lacks {key!r}", path=where,
                         hint="is this a decoder-only transformer's config?")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"config.json: {key} must be an integer, got {value!r}", path=where)
    return value


def _softcap(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def spec_from_config(cfg: dict[str, Any], name: str, where: str = "config.json") -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed Hugging Face ``config.json``."""
    if not isinstance(cfg, dict):
        raise InputError("config.json must hold a JSON object", path=where)
    architectures = cfg.get("architectures") or ["unknown"]
    top_type = str(cfg.get("model_type", ""))
    quant_cfg = cfg.get("quantization_config") or {}
    text = cfg
    if isinstance(cfg.get("text_config"), dict):  # Gemma 3, Llava, Mistral3: LM under text_config
        text = {**cfg["text_config"]}
        for key in ("torch_dtype", "dtype", "tie_word_embeddings"):
            if key not in text and key in cfg:
                text[key] = cfg[key]
        quant_cfg = quant_cfg or text.get("quantization_config") or {}
    model_type = str(text.get("model_type", top_type))
    is_gemma = model_type.startswith("gemma") or top_type.startswith("gemma")

    hidden = _int(text, "hidden_size", where)
    heads = _int(text, "num_attention_heads", where)
    kv_heads = _int(text, "num_key_value_heads", where, default=heads)
    head_dim = text.get("head_dim") or hidden // heads
    num_experts = int(
        text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts") or 0
    )
    if "tie_word_embeddings" in text:
        tied = bool(text["tie_word_embeddings"])
    else:  # transformers' defaults: Gemma ties, Llama/Qwen2/Mistral configs default to False
        tied = is_gemma
    method = quant_cfg.get("quant_method")
    method = str(method).lower() if method else None
    bits = int(quant_cfg.get("bits", quant_cfg.get("w_bit", 4 if method in INT4_METHODS else 16)))
    group = int(quant_cfg.get("group_size", quant_cfg.get("q_group_size", 128)) or 128)
    dtype = str(text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    return ModelSpec(
        name=name,
        architecture=str(architectures[0]),
        num_layers=_int(text, "num_hidden_layers", where),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        intermediate_size=_int(text, "intermediate_size", where),
        vocab_size=_int(text, "vocab_size", where),
        tie_word_embeddings=tied,
        num_experts=num_experts,
        num_experts_per_tok=int(text.get("num_experts_per_tok") or 0) if num_experts else 0,
        moe_intermediate_size=int(text.get("moe_intermediate_size") or text.get("intermediate_size"))
        if num_experts else 0,
        torch_dtype=dtype.replace("torch.", ""),
        max_position_embeddings=int(text.get("max_position_embeddings") or 2048),
        quantization=method,
        model_type=model_type,
        attention_bias=bool(text.get("attention_bias", model_type in ("qwen2", "qwen2_moe"))),
        qk_norm=model_type.startswith("qwen3") or model_type.startswith("gemma3"),
        norms_per_layer=4 if model_type.startswith(("gemma2", "gemma3")) else 2,
        shared_expert_intermediate_size=int(text.get("shared_expert_intermediate_size") or 0),
        quant_bits=bits,
        quant_group_size=group,
        sliding_window=text.get("sliding_window") if text.get("use_sliding_window", True) else None,
        attn_logit_softcapping=_softcap(text.get("attn_logit_softcapping")),
    )


def _presets_root() -> Path:
    return Path(str(resources.files("tuner") / "data" / "models"))


def preset_names() -> list[str]:
    root = _presets_root()
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())


#: Named presets shipped in tuner/data/models/<name>/config.json (real Hugging Face configs).
PRESETS: tuple[str, ...] = tuple(preset_names())


def load_model(name_or_path: str) -> ModelSpec:
    """A preset (``"qwen2.5-7b"``, case-insensitive) or a folder (or file) with ``config.json``."""
    key = name_or_path.strip().lower()
    preset = _presets_root() / key / "config.json"
    if preset.is_file():
        return _read(preset, key)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        name = path.parent.name if path.name == "config.json" else path.stem
        return _read(path, name)
    raise InputError(
        f"unknown model {name_or_path!r}: not a preset and no config.json there",
        hint=f"presets: {', '.join(PRESETS)}; or give a folder holding a Hugging Face config.json",
    )


def _read(path: Path, name: str) -> ModelSpec:
    """Parse once per file version: searches call this for every trial."""
    return _read_cached(str(path), name, path.stat().st_mtime_ns)


@lru_cache(maxsize=256)
def _read_cached(path_text: str, name: str, _mtime: int) -> ModelSpec:
    path = Path(path_text)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputError(f"config.json is not valid JSON: {err.msg}", path=path, line=err.lineno) from None
    return spec_from_config(cfg, name, str(path))


#: Hugging Face repository of each preset, for the ``vllm serve`` command a search prints.
#: Presets without an official checkpoint (community quantisations) are left out: the
#: command then names the preset, and users put their own folder or repository there.
HF_REPOS: dict[str, str] = {
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-7b-awq": "Qwen/Qwen2.5-7B-Instruct-AWQ",
    "qwen2.5-14b": "Qwen/Qwen2.5-14B-Instruct",
    "qwen2.5-32b": "Qwen/Qwen2.5-32B-Instruct",
    "qwen2.5-32b-awq": "Qwen/Qwen2.5-32B-Instruct-AWQ",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "llama-2-7b": "meta-llama/Llama-2-7b-chat-hf",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "gemma-2-9b": "google/gemma-2-9b-it",
    "gemma-2-27b": "google/gemma-2-27b-it",
    "gemma-3-27b": "google/gemma-3-27b-it",
}


def serve_model_name(name_or_path: str) -> str:
    """What to put after ``vllm serve``: a preset's Hugging Face repository, else as given."""
    return HF_REPOS.get(name_or_path.strip().lower(), name_or_path)

from __future__ import annotations

import dataclasses
import json

import pytest

from tuner.core.errors import InputError
from tuner.sim.model import PRESETS, load_model


@pytest.mark.parametrize(
    ("name", "published_b"),
    [  # parameter counts the model cards publish
        ("qwen2.5-7b", 7.61), ("qwen2.5-14b", 14.7), ("qwen2.5-32b", 32.5),
        ("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.6), ("mistral-7b", 7.25),
        ("gemma-2-27b", 27.2), ("qwen3-32b", 32.8), ("mixtral-8x7b", 46.7), ("qwen3-30b-a3b", 30.5),
    ],
)
def test_param_counts_match_model_cards(name, published_b):
    assert load_model(name).param_count() / 1e9 == pytest.approx(published_b, rel=0.015)


def test_moe_active_params_match_model_cards():
    assert load_model("mixtral-8x7b").active_param_count() / 1e9 == pytest.approx(12.9, rel=0.02)
    assert load_model("qwen3-30b-a3b").active_param_count() / 1e9 == pytest.approx(3.3, rel=0.03)
    dense = load_model("qwen2.5-7b")
    assert dense.active_param_count() == dense.param_count()


def test_required_presets_exist():
    for name in ("qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "llama-3.1-8b", "llama-3.1-70b",
                 "gemma-2-27b", "gemma-2-27b-awq"):
        assert name in PRESETS


def test_awq_weights_near_the_published_checkpoint_size():
    # Qwen/Qwen2.5-7B-Instruct-AWQ: ~5.58 GB of safetensors (embeddings and lm_head in fp16).
    awq = load_model("qwen2.5-7b-awq")
    assert awq.quantization == "awq"
    assert awq.weight_bytes() / 1e9 == pytest.approx(5.58, rel=0.05)
    bf16 = load_model("qwen2.5-7b")
    assert bf16.weight_bytes() == 2 * bf16.param_count()
    assert bf16.weight_bytes("fp8") < 0.6 * bf16.weight_bytes()


def test_kv_heads_replicate_when_tp_exceeds_them_and_fp8_halves():
    m = load_model("qwen2.5-7b")  # 4 KV heads
    assert m.kv_bytes_per_token(4, 2) * 4 == m.kv_bytes_per_token(1, 2)
    assert m.kv_bytes_per_token(8, 2) == m.kv_bytes_per_token(4, 2)
    assert m.kv_bytes_per_token(1, 1) * 2 == m.kv_bytes_per_token(1, 2)
    # Replicated K/V projections make a TP-8 rank hold more than 1/8 of the weights.
    assert m.weight_bytes_per_rank(None, 8) > m.weight_bytes() / 8


def test_gemma3_text_config_nesting_and_explicit_head_dim(tmp_path):
    cfg = {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                        "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
                        "head_dim": 256, "vocab_size": 262208, "max_position_embeddings": 131072},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(tmp_path))
    assert m.num_layers == 34 and m.head_dim == 256 and m.hidden_size // m.num_heads == 320
    assert m.tie_word_embeddings  # Gemma ties by default
    assert m.architecture == "Gemma3ForConditionalGeneration" and m.qk_norm
    # Gemma 3 4B's model card: 3.88B in the language model (plus a 0.4B vision tower).
    assert m.param_count() / 1e9 == pytest.approx(3.88, rel=0.02)


def test_quantization_config_is_read(tmp_path):
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1024,
           "intermediate_size": 2816, "num_hidden_layers": 24, "num_attention_heads": 16,
           "num_key_value_heads": 16, "vocab_size": 151936,
           "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(tmp_path / "config.json"))
    assert m.quantization == "gptq" and m.quant_bits == 4
    # Small model: the fp16 embeddings (2 x 155M) keep it well above a quarter.
    assert m.weight_bytes() < 0.7 * dataclasses.replace(m, quantization=None).weight_bytes()


def test_bad_configs_name_the_file(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError) as err:
        load_model(str(tmp_path))
    assert "config.json:1" in str(err.value)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 10}))
    with pytest.raises(InputError, match="num_attention_heads"):
        load_model(str(tmp_path))
    with pytest.raises(InputError, match="presets"):
        load_model("no-such-model-xyz")

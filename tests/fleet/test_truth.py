"""tuner.fleet.truth: which vLLM lines run on a kind, what vLLM refuses there in its own words and in
its order (article 000's 27B AWQ on one V100-16GB), what the box serves instead, and the ceilings."""
from __future__ import annotations

import dataclasses

import pytest

from tuner.core.errors import ConfigRejected
from tuner.fleet.truth import CURRENT, ceiling, facts, lines_for, refusals, serves_instead, wheels_run
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.hardware import get_gpu
from tuner.sim.memory import plan_memory
from tuner.sim.model import load_model, preset_names

V100 = Deployment(model="gemma-2-27b-awq", gpu="V100-16GB-PCIE", vllm_version="0.6.3")
ARTICLE = ServeConfig(gpu_memory_utilization=0.92, max_model_len=8192, enforce_eager=True)  # article 000's flags


def test_vllm_lines_by_compute_capability():
    v100 = {x.line: x for x in lines_for(get_gpu("V100-16GB-PCIE"))}
    assert [x.runs for x in v100.values()] == [True, True, True, False]      # no sm_70 wheels from 0.20
    assert (v100["0.6.x"].engine, v100["0.6.x"].attention) == ("V0", "XFORMERS")
    assert (v100["0.10.2-0.19.x"].engine, v100["0.10.2-0.19.x"].attention) == ("V1", "TRITON_ATTN")
    t4 = {x.line: x for x in lines_for(get_gpu("T4"))}
    assert t4["0.20.0+"].runs and t4["0.20.0+"].attention == "TRITON_ATTN"  # 7.5: built, no FlashAttention
    assert all(x.attention == "FLASH_ATTN" for x in lines_for(get_gpu("L4")))
    assert wheels_run(get_gpu("V100-32GB-SXM2"), "0.19.1") and not wheels_run(get_gpu("V100-32GB-SXM2"), "0.20.0")
    assert facts(get_gpu("V100-16GB-PCIE"))["quantization"] == {"fp8": "needs 7.5", "awq": "needs 7.5", "gptq": "yes"}
    assert not facts(get_gpu("T4"))["bf16"] and facts(get_gpu("L4"))["fp8"] == "native W8A8"


def test_article_000_27b_awq_on_one_v100_16gb_in_vllms_words_and_order():
    found = refusals(V100, ARTICLE, ("0.6.3", "0.6.6", CURRENT))
    by = [(r.vllm_version, r.check) for r in found]
    # 0.6.3: AWQ needs compute capability 7.5 before anything is loaded; its GPTQ twin (min 6.0) then stops at
    # XFormers, which refused Gemma 2's soft capping before 0.6.5: memory is never reached
    assert by[:2] == [("0.6.3", "quantization"), ("0.6.3", "attention")]
    assert found[0].message == ("The quantization method awq is not supported for the current GPU. "
                                "Minimum capability: 75. Current capability: 70.")
    assert found[1].message == "XFormers does not support attention logits soft capping." and "gptq" in found[1].tried
    # 0.6.6 warns about the soft cap instead, so GPTQ reaches the memory check: refused for memory (V0's words)
    assert by[2:4] == [("0.6.6", "quantization"), ("0.6.6", "memory")]
    assert found[3].message.startswith("No available memory for the cache blocks.")
    # current vLLM: no wheels for sm_70 at all; then AWQ; then GPTQ's weights alone exceed the budget
    assert by[4:] == [(CURRENT, "wheels"), (CURRENT, "quantization"), (CURRENT, "memory")]
    assert "no kernel image is available" in found[4].message
    weights = float(found[6].tried.split("GiB budget, ")[1].split(" GiB of weights")[0])
    budget = float(found[6].tried.split(" = ")[1].split(" GiB budget")[0])
    assert weights > budget == pytest.approx(15.77 * 0.92, abs=0.01)


def test_what_the_v100_serves_instead_is_the_largest_model_that_starts():
    text = serves_instead(V100, ARTICLE)
    name = text.split(":")[0].split(" (")[0]
    quant = "gptq" if "GPTQ" in text.split(":")[0] else None
    best = load_model(name).param_count()
    dep = dataclasses.replace(V100, model=name, quantization=quant, dtype="float16")
    assert plan_memory(dep, ARTICLE).kv_cache_tokens >= 8192
    for other in preset_names():        # no larger preset starts there, 16-bit or GPTQ
        if load_model(other).param_count() <= best:
            continue
        for q in (None, "gptq"):
            d = dataclasses.replace(V100, model=other, quantization=q if not load_model(other).quantization else None,
                                    dtype="float16")
            cfg = dataclasses.replace(ARTICLE, max_model_len=min(8192, load_model(other).max_position_embeddings))
            with pytest.raises(ConfigRejected):
                plan_memory(d, cfg)


def test_ceilings_beside_article_000s_arithmetic():
    # the article: 900 GB/s / 14.5 GB = 62 tok/s; the real weights of a ~27B AWQ model are 15.9 GB
    # (docs/simulator-memory.md): on a 4090's 1,008 GB/s, 1008 / 15.9 = 63 tok/s for one stream
    plan = plan_memory(dataclasses.replace(V100, gpu="RTX-4090", vllm_version="0.26.0"), ARTICLE)
    c = ceiling(plan)
    assert 14.7 < c.weights_gib < 14.9
    assert 60 < c.decode_tokens_per_s < 66
    # all 27.2 B parameters at 2 FLOPs each, on 165 TFLOP/s: ~3,000 tokens/s
    assert 2900 < c.compute_tokens_per_s < 3150
    # two L4s (300 GB/s each) at TP 2 read half the weights each: 2 x 300 / 15.9 = 38 tok/s
    two = ceiling(plan_memory(dataclasses.replace(V100, gpu="L4", vllm_version="0.26.0", gpu_count=2),
                              dataclasses.replace(ARTICLE, tensor_parallel_size=2)))
    assert two.tp == 2 and 35 < two.decode_tokens_per_s < 40

"""A predicted refusal put to the test (``tuner search --start-refused``).

The memory planner predicts vLLM's startup decision, and by default a configuration it
predicts vLLM will refuse is never started: no GPU time is spent on it. A prediction can sit
inside its own error (Qwen3-32B in bf16 on one H100 with vLLM 0.26.0's defaults: 10.0 GiB of
KV cache needed for one 40,960-token request, 9.63 GiB predicted), and a user who wants to
know starts it anyway: with ``start_refused`` a refusal for memory (:data:`MEMORY_REFUSALS`)
is recorded as a prediction (:func:`prediction`: the KV memory needed and predicted, the
shortfall, and the planner's error measured on real starts of that GPU kind), the
configuration is started, and the outcome judges it (:func:`judge`): vLLM's refusal in its
own words, or the KV cache the start got against the prediction.

The error band is data (``tuner/data/calibration/kv_error.yaml``, written by
``benchmarks/kv_error.py`` from every measured start): (predicted - measured) / measured
KV blocks, > 0 where vLLM found less than predicted.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import yaml

from tuner.core.errors import ConfigRejected
from tuner.core.urls import redact
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.memory import plan_memory

#: Refusals the planner predicts from its memory arithmetic (the rest are vLLM's fixed
#: rules: heads that TP does not divide, a dtype or quantisation the GPU lacks).
MEMORY_REFUSALS = ("max_model_len", "no_kv_memory")
KV_ERROR = Path(__file__).resolve().parents[1] / "data" / "calibration" / "kv_error.yaml"
GiB = 2**30


@functools.lru_cache(maxsize=1)
def _bands() -> dict[str, Any]:
    return yaml.safe_load(KV_ERROR.read_text()) if KV_ERROR.is_file() else {}


def kv_error(gpu: str, moe: bool = False) -> dict[str, Any] | None:
    """The planner's KV error measured on ``gpu`` (dense or MoE shapes; the dense band where no
    MoE start was measured), or None where no start of that GPU kind was measured."""
    kinds = (_bands().get("gpus") or {}).get(gpu) or {}
    band = kinds.get("moe" if moe else "dense") or kinds.get("dense")
    return None if band is None else {**band, "gpu": gpu, "vllm_version": _bands().get("vllm_version")}


def prediction(deployment: Deployment, config: ServeConfig, err: ConfigRejected) -> dict[str, Any]:
    """What the planner predicted for a configuration it says vLLM will refuse for memory:
    the KV memory one max-model-len request needs and the memory predicted for it, the
    shortfall, and where that lies against the planner's measured error."""

    plan = plan_memory(deployment, config, strict=False)
    needed = (math.ceil(plan.config.max_model_len / plan.config.block_size) * plan.page_bytes if err.kind == "max_model_len"  # noqa: E501
              else plan.page_bytes)
    out: dict[str, Any] = {"kind": err.kind, "message": err.message, "needed_gib": needed / GiB,
                           "available_gib": plan.kv_bytes / GiB, "short_gib": (needed - plan.kv_bytes) / GiB}
    band = kv_error(plan.gpu.name, moe=bool(getattr(plan.model, "num_experts", 0)))
    # vLLM finds needed / available - 1 more KV memory than predicted only where the planner is pessimistic by that much
    out["more_needed_pct"] = 100.0 * (needed / plan.kv_bytes - 1.0) if plan.kv_bytes > 0 else math.inf
    if band is not None:
        out["error_band"] = band
        out["within_error"] = -band["low_pct"] >= out["more_needed_pct"]
    out["text"] = margin_text(out)
    return out


def margin_text(p: dict[str, Any]) -> str:
    """``0.37 GiB short of the 10.0 GiB one max-model-len request needs (vLLM would have to find
    3.8 % more KV memory than predicted; the planner's KV on 7 measured starts of H100-SXM: -0.09 %
    to +0.98 %, outside it)``."""
    need = "one max-model-len request needs" if p["kind"] == "max_model_len" else "one KV block needs"
    text = f"{p['short_gib']:.2f} GiB short of the {p['needed_gib']:.2f} GiB {need}"
    if not math.isfinite(p["more_needed_pct"]):
        return text + " (no KV memory predicted at all)"
    text += f" (vLLM would have to find {p['more_needed_pct']:.1f} % more KV memory than predicted"
    band = p.get("error_band")
    if band is None:
        return text + "; no start of this GPU kind was measured, so the planner's error here is unknown)"
    where = "within it" if p["within_error"] else "outside it"
    return (text + f"; the planner's KV on {band['starts']} measured starts of {band['gpu']} with vLLM "
            f"{band['vllm_version']}: {band['low_pct']:+.2f} % to {band['high_pct']:+.2f} %, {where})")


def judge(predicted: dict[str, Any], outcome: ConfigRejected | dict[str, Any]) -> dict[str, Any]:
    """The start's outcome beside the prediction: ``confirmed`` where vLLM refused too (in its
    own words), else the KV cache the start got; ``judged`` says it in one line (the
    prediction's own ``text`` stays beside it)."""
    if isinstance(outcome, ConfigRejected):
        said = redact(outcome.message)[:500]
        return {"confirmed": True, "outcome": "refused", "refused_kind": outcome.kind, "said": said,
                "judged": f"predicted refused ({predicted['kind']}) and refused at start ({outcome.kind}): {said}"}
    tokens = outcome.get("kv_cache_tokens")
    got = f"a KV cache of {int(tokens):,} tokens" if tokens else "no KV size reported"
    return {"confirmed": False, "outcome": "started", "kv_cache_tokens": tokens,
            "judged": (f"the memory planner predicted vLLM would refuse this configuration ({predicted['kind']}: "
                     f"{predicted['text']}); it started with {got}: the prediction was wrong")}


__all__ = ["MEMORY_REFUSALS", "judge", "kv_error", "margin_text", "prediction"]

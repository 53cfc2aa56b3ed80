"""The memory fit: least squares of the memory planner's empirical constants
(:data:`tuner.sim.memory.EMPIRICAL`) to measured starts (:func:`fit_memory`)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tuner.calibrate.points import Startup
from tuner.config import Deployment
from tuner.errors import InputError


GiB = 1 << 30


def fit_memory(points: Sequence[Startup], deployment: Deployment, *, graph_fraction: float | None = None,
               ) -> tuple[dict[str, float], dict[str, Any]]:
    """Least squares of the memory planner's empirical constants to measured starts (each
    on its own model shape: ``Startup.model``, else the deployment's).

    vLLM's ``available KV = ceil(total x gmu) - weights - peak activation - non-torch``
    (``v1/worker/gpu_worker.py``). "Model loading took X GiB" gives each start's weights
    (the median overhead over the shapes' bytes is kept for the planner); the rest,
    ``budget - weights - available``, is fitted as ``fixed + a x tokens x hidden + b x
    max_num_seqs x vocab + m x tokens x experts_per_token x hidden (MoE) + g x
    graph_estimate`` (``tokens``: :func:`tuner.sim.memory.activation_tokens`) with every coefficient >= 0 and ``g`` in [0, 1]
    (the share of the planner's CUDA-graph estimate that really comes out of the KV
    budget). Where vLLM also logged the peak activation ("Actual usage is ... GiB for peak
    activation"), that value is a second residual of the start. ``graph_fraction`` fixes
    ``g`` instead of fitting it (what the starts show directly: an eager and a graph start
    of one configuration with the same KV cache mean 0)."""
    from scipy.optimize import least_squares

    from tuner.sim.hardware import get_gpu
    from tuner.sim.memory import EMPIRICAL, activation_tokens, default_batch_limits
    from tuner.sim.memory.planner import _cudagraph_sizes
    from tuner.versions import parse_version
    from tuner.sim.model import load_model

    gpu = get_gpu(deployment.gpu)
    version = parse_version(deployment.vllm_version)
    ok = [s for s in points if s.ok and s.available_kv_gib is not None]
    if not ok:
        raise InputError("no successful start with 'Available KV cache memory' to fit the memory planner to")
    # vLLM logs its non-torch memory ("... GiB for non-torch memory"): the median of the
    # starts that logged it, else the planner's estimate
    logged = [s.non_torch_gib for s in ok if s.non_torch_gib is not None]
    non_torch = float(np.median(logged)) * GiB if logged else float(EMPIRICAL["non_torch_bytes"])
    eager_seen = any(s.config.enforce_eager for s in ok)
    overheads, rows, y, act_rows, act_y = [], [], [], [], []
    for s in ok:
        model = load_model(s.model or deployment.model)
        shapes = model.weight_bytes_per_rank(None, 1)
        weights = s.model_load_gib * GiB if s.model_load_gib else shapes
        if s.model_load_gib:
            overheads.append(weights - shapes)
        c = s.config
        mml = c.max_model_len or model.max_position_embeddings
        d_seqs, d_tokens = default_batch_limits(gpu, version, mml)
        seqs = c.max_num_seqs or d_seqs
        mbt = c.max_num_batched_tokens or (min(d_tokens, seqs * mml) if c.max_num_seqs else d_tokens)
        graphs = 0.0 if c.enforce_eager else (EMPIRICAL["cudagraph_bytes_per_layer_per_size"]
                                              * model.num_layers * _cudagraph_sizes(seqs))
        tokens = activation_tokens(mbt, d_tokens, c.enforce_eager)
        moe = tokens * model.num_experts_per_tok * model.hidden_size if model.is_moe else 0.0
        # compiled and eager profile runs peak apart (tuner.sim.memory.empirical._activation_slope)
        eager = bool(c.enforce_eager and eager_seen)
        act = [1.0, 0.0 if eager else tokens * model.hidden_size, seqs * model.vocab_size, moe,
               tokens * model.hidden_size if eager else 0.0]
        budget = math.ceil(gpu.memory_bytes * (c.gpu_memory_utilization or 0.92))
        rows.append([*act, graphs])
        y.append(budget - weights - non_torch - s.available_kv_gib * GiB)
        if s.peak_activation_gib is not None:
            act_rows.append([*act, 0.0])
            act_y.append(s.peak_activation_gib * GiB)
    a = np.array(rows + act_rows)
    target = np.array(y + act_y)
    # columns: fixed, compiled per token x hidden, per logit, MoE, eager per token x hidden, graphs
    scale = np.array([GiB, 1.0, 1.0, 1.0, 1.0, 1.0])

    def resid(x: np.ndarray) -> np.ndarray:
        return (a @ (x * scale) - target) / GiB

    x0 = np.array([0.5, EMPIRICAL["activation_bytes_per_token_per_hidden"], EMPIRICAL["sampler_bytes_per_logit"],
                   1.0, EMPIRICAL["activation_bytes_per_token_per_hidden"], 0.5])
    lo, hi = [0, 0, 0, 0, 0, 0], [20, 64, 16, 256, 64, 1]
    if graph_fraction is not None:
        x0[5] = graph_fraction
        lo[5], hi[5] = graph_fraction, graph_fraction + 1e-12
    sol = least_squares(resid, x0, bounds=(lo, hi))
    fixed, per_tok, per_logit, per_moe, per_tok_eager, g = sol.x
    weight_overhead = max(0.0, float(np.median(overheads))) if overheads else 0.0
    memory = {
        "weight_overhead_bytes": round(weight_overhead),
        "activation_fixed_bytes": round(fixed * GiB),
        "activation_bytes_per_token_per_hidden": round(float(per_tok), 4),
        "sampler_bytes_per_logit": round(float(per_logit), 4),
        "moe_activation_bytes_per_token_per_hidden": round(float(per_moe), 4),
        "cudagraph_kv_fraction": round(float(g), 3),
        "non_torch_bytes": round(non_torch),
    }
    if eager_seen:
        memory["eager_activation_bytes_per_token_per_hidden"] = round(float(per_tok_eager), 4)
    kv = sol.fun[:len(rows)]
    info = {"starts": len(ok), "residual_gib_rms": float(np.sqrt(np.mean(kv ** 2))),
            "residual_gib_max": float(np.max(np.abs(kv))), "peak_activations": len(act_rows)}
    return memory, info


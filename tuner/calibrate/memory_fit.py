"""The memory fit: least squares of the memory planner's empirical constants
(:data:`tuner.sim.memory.EMPIRICAL`) to measured starts (:func:`fit_memory`)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tuner.calibrate.points import Startup
from tuner.core.errors import InputError
from tuner.core.versions import parse_version
from tuner.serving.config import Deployment
from tuner.sim.hardware import get_gpu
from tuner.sim.memory import EMPIRICAL, default_batch_limits
from tuner.sim.memory.planner import _cudagraph_sizes
from tuner.sim.model import load_model

GiB = 1 << 30
#: The memory fit's loss: residuals past vLLM's log resolution (it prints GiB to 0.01) count
#: linearly, not squared, so a restart that hit the torch.compile cache (0.07 GiB under a cold
#: start on the 7B shape: 1.06 against 1.13 GiB) or the MoE shape's other engine path does not
#: drag the cold-compile figures every new configuration starts with.
LOSS, F_SCALE = "soft_l1", 0.01


def fit_memory(points: Sequence[Startup], deployment: Deployment, *, graph_fraction: float | None = None,
               loads: Sequence[Startup] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Least squares of the memory planner's empirical constants to measured starts (each
    on its own model shape: ``Startup.model``, else the deployment's).

    vLLM's ``available KV = ceil(total x gmu) - weights - peak activation - non-torch``
    (``v1/worker/gpu_worker.py``). "Model loading took X GiB" gives each start's weights;
    the planner keeps each shape's own overhead over its weight shapes (the median of that
    shape's starts in ``loads``, default ``points``: a logged figure, not a fit) and, for a
    shape never loaded and for the step timer, the median over ``points``. The rest, ``budget - weights -
    available``, is fitted as ``fixed + a x tokens x hidden + c x vocab x hidden (compiled
    starts: the cold torch.compile's peak inside vLLM's profile run) + m x tokens x
    experts_per_token x hidden (MoE) + g x graph_estimate``, ``tokens`` the start's
    max-num-batched-tokens (vLLM's ``profile_run`` runs that many), eager starts with their
    own slope instead of ``a`` and ``c``; every coefficient >= 0 and ``g`` in [0, 1] (the
    share of the planner's CUDA-graph estimate that really comes out of the KV budget).
    The dummy sampler run (``max_num_seqs x vocab`` logits) comes after the forward and
    stays under its peak on vLLM 0.26.0, so it is not a column (the profile sets it 0).
    Where vLLM also logged the peak activation ("Actual usage is ... GiB for peak
    activation"), that value is a second residual of the start. ``graph_fraction`` fixes
    ``g`` instead of fitting it (what the starts show directly: an eager and a graph start
    of one configuration with the same KV cache mean 0)."""

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
    overhead, fitted_overheads = _weight_overheads(ok, ok if loads is None else loads, deployment)
    rows, y, act_rows, act_y = [], [], [], []
    for s in ok:
        act, graphs, weights = _columns(s, deployment, gpu, version, overhead, eager_seen)
        budget = math.ceil(gpu.memory_bytes * (s.config.gpu_memory_utilization or 0.92))
        rows.append([*act, graphs])
        y.append(budget - weights - non_torch - s.available_kv_gib * GiB)
        if s.peak_activation_gib is not None:
            act_rows.append([*act, 0.0])
            act_y.append(s.peak_activation_gib * GiB)
    sol = _solve(np.array(rows + act_rows), np.array(y + act_y), graph_fraction)
    memory = _constants(sol.x, overhead, fitted_overheads, non_torch, eager_seen)
    kv = sol.fun[:len(rows)]
    info = {"starts": len(ok), "residual_gib_rms": float(np.sqrt(np.mean(kv ** 2))),
            "residual_gib_max": float(np.max(np.abs(kv))), "peak_activations": len(act_rows)}
    return memory, info


def _constants(x: np.ndarray, overhead: dict[str, float], fitted_overheads: list[float], non_torch: float,
               eager_seen: bool) -> dict[str, Any]:
    """The memory planner's empirical constants from the fit's solution ``x`` (columns as
    :func:`_columns`, then graphs) and the logged figures beside it."""
    fixed, per_tok, per_vh, per_moe, per_tok_eager, g = x
    memory: dict[str, Any] = {
        # the median over the fitted starts (the step-time fit's basis, and the figure for a shape
        # never loaded); each loaded shape's own figure beside it
        "weight_overhead_bytes": round(max(0.0, float(np.median(fitted_overheads)))) if fitted_overheads else 0,
        "weight_overhead_by_model": {name: round(v) for name, v in sorted(overhead.items())},
        "activation_fixed_bytes": round(fixed * GiB),
        "activation_bytes_per_token_per_hidden": round(float(per_tok), 4),
        "compile_bytes_per_vocab_hidden": round(float(per_vh), 4),
        "sampler_bytes_per_logit": 0.0,
        "moe_activation_bytes_per_token_per_hidden": round(float(per_moe), 4),
        "cudagraph_kv_fraction": round(float(g), 3),
        "non_torch_bytes": round(non_torch),
    }
    if eager_seen:
        memory["eager_activation_bytes_per_token_per_hidden"] = round(float(per_tok_eager), 4)
    return memory


def _weight_overheads(ok: Sequence[Startup], loads: Sequence[Startup],
                      deployment: Deployment) -> tuple[dict[str, float], list[float]]:
    """Each loaded shape's weight overhead (the median over its starts in ``loads``: logged
    "Model loading took" over its weight shapes), and the overheads of the fitted starts."""

    by_model: dict[str, list[float]] = {}
    for s in loads:
        if s.model_load_gib:
            name = s.model or deployment.model
            by_model.setdefault(name, []).append(s.model_load_gib * GiB - load_model(name).weight_bytes_per_rank(None, 1))  # noqa: E501
    overhead = {name: max(0.0, float(np.median(v))) for name, v in by_model.items()}
    fitted = [s.model_load_gib * GiB - load_model(s.model or deployment.model).weight_bytes_per_rank(None, 1)
              for s in ok if s.model_load_gib]
    return overhead, fitted


def _columns(s: Startup, deployment: Deployment, gpu: Any, version: tuple[int, int, int],
             overhead: dict[str, float], eager_seen: bool) -> tuple[list[float], float, float]:
    """One start's activation columns (fixed, compiled per token x hidden, compiled per
    vocab x hidden, MoE, eager per token x hidden), its graph estimate and its weights."""

    name = s.model or deployment.model
    model = load_model(name)
    weights = s.model_load_gib * GiB if s.model_load_gib else (model.weight_bytes_per_rank(None, 1)
                                                               + overhead.get(name, 0.0))
    c = s.config
    mml = c.max_model_len or model.max_position_embeddings
    d_seqs, d_tokens = default_batch_limits(gpu, version, mml)
    seqs = c.max_num_seqs or d_seqs
    tokens = c.max_num_batched_tokens or (min(d_tokens, seqs * mml) if c.max_num_seqs else d_tokens)
    graphs = 0.0 if c.enforce_eager else (EMPIRICAL["cudagraph_bytes_per_layer_per_size"]
                                          * model.num_layers * _cudagraph_sizes(seqs))
    moe = tokens * model.num_experts_per_tok * model.hidden_size if model.is_moe else 0.0
    # compiled and eager profile runs peak apart (tuner.sim.memory.empirical._activation_slope)
    eager = bool(c.enforce_eager and eager_seen)
    th = tokens * model.hidden_size
    vh = 0.0 if c.enforce_eager else model.vocab_size * model.hidden_size
    return [1.0, 0.0 if eager else th, vh, moe, th if eager else 0.0], graphs, weights


def _solve(a: np.ndarray, target: np.ndarray, graph_fraction: float | None) -> Any:
    """The bounded robust least squares of ``a @ x = target`` (columns as :func:`_columns`,
    then graphs; ``graph_fraction`` fixes the last)."""
    from scipy.optimize import least_squares

    scale = np.array([GiB, 1.0, 1.0, 1.0, 1.0, 1.0])

    def resid(x: np.ndarray) -> np.ndarray:
        return (a @ (x * scale) - target) / GiB

    x0 = np.array([0.1, 4.0, 2.0, 1.0, EMPIRICAL["activation_bytes_per_token_per_hidden"], 0.5])
    lo, hi = [0, 0, 0, 0, 0, 0], [20, 64, 16, 256, 64, 1]
    if graph_fraction is not None:
        x0[5] = graph_fraction
        lo[5], hi[5] = graph_fraction, graph_fraction + 1e-12
    return least_squares(resid, x0, bounds=(lo, hi), loss=LOSS, f_scale=F_SCALE)

"""How long one engine step takes: a roofline of the batch actually scheduled.

For a step that schedules ``T`` tokens over ``n`` requests, per tensor-parallel rank:

* bytes  = weights (read once per step) + KV cache read by attention
  (``kv_bytes_per_token`` × context tokens of every scheduled request);
  ``t_mem = bytes / (hbm_bandwidth × hbm_efficiency)``;
* FLOPs  = 2 × active parameters × T (the matmuls) + attention
  (4 × layers × heads × head_dim per query-key pair: QKᵀ and PV, 2 FLOPs per MAC);
  ``t_flops = FLOPs / (fp16_flops × flops_efficiency)``;
* launch = CPU time to launch the step's kernels: layers × a per-layer cost that depends
  on the mode (full CUDA graph for decode-only batches up to the capture size, piecewise
  graphs for mixed batches within it, compiled code above it, eager with
  ``--enforce-eager``). Launches are asynchronous, so they overlap with GPU work:
  the step takes ``max(t_mem, t_flops, launch)``.
* plus the serial costs: a fixed per-step overhead (scheduler, input preparation,
  sampler), a per-request overhead, and tensor-parallel all-reduces (2 per layer, each
  ``latency + 2(tp-1)/tp × T × hidden × 2 bytes / (link_bandwidth × link_efficiency)``,
  ring all-reduce).

Mixture-of-experts layers read only the experts the step's tokens are routed to: with
``k`` of ``E`` experts per token and routing spread over the experts, ``T`` tokens touch
``E(1 - (1 - k/E)^T)`` of them per layer, so a one-user decode step reads about ``k/E`` of
the expert weights and a large batch all of them. Their FLOPs (``k`` experts a token) run
at ``flops_efficiency x moe_flops_efficiency`` (grouped GEMMs of a few tokens each), the
rest at ``flops_efficiency``.


The constants come from :class:`tuner.sim.calibration.Calibration`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tuner.sim.calibration import Calibration

if TYPE_CHECKING:
    from tuner.sim.memory import MemoryPlan

ACTIVATION_BYTES = 2  # fp16/bf16 hidden states travel through the all-reduce


def cudagraph_capture_size(max_num_seqs: int) -> int:
    """vLLM's default ``max_cudagraph_capture_size``: min(2 × max_num_seqs, 512)
    (config/vllm.py; decode query length 1)."""
    return min(2 * max_num_seqs, 512)


class StepTimer:
    """Step durations for one replica (one memory plan, one calibration)."""

    def __init__(self, plan: MemoryPlan, calib: Calibration) -> None:
        gpu, model, tp = plan.gpu, plan.model, plan.tensor_parallel_size
        self.calib = calib
        self.tp = tp
        self.eager = bool(plan.enforce_eager)
        self.capture = cudagraph_capture_size(plan.max_num_seqs)
        bw = gpu.hbm_bandwidth * calib.hbm_efficiency
        fl = gpu.fp16_flops * calib.flops_efficiency
        # seconds per unit of work, per rank
        expert_bytes = model.expert_bytes(plan.quantization) / tp if model.is_moe else 0.0
        self.s_weights = (plan.weight_bytes - expert_bytes) / bw   # read by every step
        self.s_experts = expert_bytes / bw                          # read in the share the step touches
        self.moe_keep = 1.0 - model.num_experts_per_tok / model.num_experts if model.is_moe else 1.0
        self.s_kv_token = model.kv_bytes_per_token(tp, plan.kv_cache_dtype_bytes) / bw
        expert_active = model.active_expert_params()
        moe_fl = fl * min(getattr(calib, "moe_flops_efficiency", 1.0), 1.0)
        self.s_token_flops = (2.0 * (model.active_param_count() - expert_active) / tp / fl
                              + 2.0 * expert_active / tp / moe_fl)
        heads_rank = max(1, model.num_heads // tp)
        self.s_attn_pair = 4.0 * model.num_layers * heads_rank * model.head_dim / fl
        layers = model.num_layers
        self.launch = {m: layers * s for m, s in calib.launch_per_layer_s.items()}
        self.fixed = calib.step_overhead_s
        self.per_seq = calib.per_seq_overhead_s
        if tp > 1:
            n_ar = 2 * layers
            self.ar_fixed = n_ar * calib.allreduce_latency_s
            self.ar_token = (n_ar * 2.0 * (tp - 1) / tp * model.hidden_size * ACTIVATION_BYTES
                             / (gpu.link_bandwidth * calib.link_efficiency))
        else:
            self.ar_fixed = 0.0
            self.ar_token = 0.0

    def mode(self, num_tokens: int, num_seqs: int, decode_only: bool) -> str:
        if self.eager:
            return "eager"
        if decode_only and num_seqs <= self.capture:
            return "graph"
        return "piecewise" if num_tokens <= self.capture else "compiled"

    def experts_read(self, num_tokens: float | np.ndarray) -> float | np.ndarray:
        """Seconds reading the experts ``num_tokens`` tokens are routed to (0 when dense)."""
        if not self.s_experts:
            return 0.0
        return self.s_experts * (1.0 - self.moe_keep ** np.asarray(num_tokens, dtype=np.float64))

    def step(self, num_tokens: int, num_seqs: int, decode_only: bool,
             ctx_tokens: float, attn_pairs: float) -> float:
        """Seconds for a step scheduling ``num_tokens`` over ``num_seqs`` requests.
        ``ctx_tokens``: KV tokens attention reads (context incl. the new tokens, summed);
        ``attn_pairs``: query-key pairs, Σ new × (computed + (new+1)/2)."""
        if num_tokens <= 0:
            return 0.0
        t_mem = self.s_weights + float(self.experts_read(num_tokens)) + self.s_kv_token * ctx_tokens
        t_fl = self.s_token_flops * num_tokens + self.s_attn_pair * attn_pairs
        t_launch = self.launch[self.mode(num_tokens, num_seqs, decode_only)]
        return (max(t_mem, t_fl, t_launch) + self.fixed + self.per_seq * num_seqs
                + self.ar_fixed + self.ar_token * num_tokens)

    def decode_run(self, n: int, ctx0: float, k: int) -> np.ndarray:
        """Durations of ``k`` consecutive decode-only steps of the same ``n`` requests whose
        computed tokens sum to ``ctx0`` before the first: step t reads ctx0 + n(t+1) tokens.
        Equal, to float rounding, to calling :meth:`step` k times."""
        t = np.arange(k, dtype=np.float64)
        ctx = ctx0 + n * (t + 1.0)
        t_mem = self.s_weights + float(self.experts_read(n)) + self.s_kv_token * ctx
        t_fl = self.s_token_flops * n + self.s_attn_pair * ctx
        t_launch = self.launch[self.mode(n, n, True)]
        serial = self.fixed + self.per_seq * n + self.ar_fixed + self.ar_token * n
        return np.maximum(np.maximum(t_mem, t_fl), t_launch) + serial

"""How long one engine step takes: a roofline of the batch actually scheduled, kernel class
by kernel class.

A step's kernels run one after another, so each class is bound by its own resource and
their times add. For a step that schedules ``T`` tokens over ``n`` requests, per
tensor-parallel rank (``bw = hbm_bandwidth × hbm_efficiency``, ``fl = fp16_flops ×
flops_efficiency``):

* the dense matmuls: ``max(weights / bw, FLOPs / fl)``. The weights are read once a step,
  except the input-embedding table, which is looked up row by row (unless the LM head shares
  it). FLOPs are 2 × the transformer blocks' parameters per token, plus the LM head (2 ×
  vocab × hidden) once per scheduled request: vLLM computes logits only at each request's
  last scheduled position (``gpu_model_runner.py``: ``logits_indices = query_start_loc[1:] -
  1``, partial prefills included), so a prefill token does not pay for the vocabulary;
* attention: ``max(KV bytes / bw, attention FLOPs / fl)``: the KV cache of every scheduled
  request read (``kv_bytes_per_token`` × its context) against 4 × layers × heads × head_dim
  FLOPs per query-key pair (QKᵀ and PV). Decodes riding along a prefill chunk thus cost
  their KV read on top of the chunk's GEMMs instead of hiding under them;
* routed experts (mixture of experts): with ``k`` of ``E`` experts per token and routing
  spread over the experts, ``T`` tokens touch ``E(1 - (1 - k/E)^T)`` of them per layer (one
  user's decode step reads about ``k/E`` of the expert weights, a large batch all of them).
  vLLM's fused MoE kernel sorts the ``T × k`` token-expert pairs by expert and pads each
  expert's share to a multiple of its tile height BLOCK_SIZE_M (``moe_align_block_size``), so
  the expert GEMMs compute the padded rows, at ``flops_efficiency × moe_flops_efficiency``:
  twice the real rows around a thousand tokens, nearly none extra at eight thousand. Each
  MoE layer also costs a fixed ``moe_layer_s`` a step (its small kernels: router GEMM, top-k
  softmax, the fused-MoE kernels' latency at a few hundred programs, the sum of the k
  outputs), and the expert weights stream at their own ``moe_hbm_efficiency``: a dense
  layer's fixed costs are folded into ``hbm_efficiency`` (the dense weights are read whole
  every step), an MoE layer's cannot be (the expert bytes a step reads grow sixteen-fold
  from one user to all experts). Campaign 5 of ``benchmarks/h200`` (an H100, two starts,
  decode at 1-32 users) determines both: 32.3 us a layer, 0.870 of peak;
* launch = CPU time to launch the step's kernels: layers × a per-layer cost that depends
  on the mode (full CUDA graph for decode-only batches up to the capture size, piecewise
  graphs for mixed batches within it, compiled code above it, eager with
  ``--enforce-eager``). Launches are asynchronous, so they overlap with GPU work:
  the step takes ``max(GPU time, launch)``;
* plus the serial costs: a fixed per-step overhead (scheduler, input preparation,
  sampler), a per-request overhead, and tensor-parallel all-reduces (2 per layer, each
  ``latency + 2(tp-1)/tp × T × hidden × 2 bytes / (link_bandwidth × link_efficiency)``,
  ring all-reduce).

The constants come from :class:`tuner.sim.calibration.Calibration`.
"""
from __future__ import annotations

from functools import lru_cache
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


def moe_block_size_m(num_tokens: int, experts_per_tok: int, num_experts: int) -> int:
    """BLOCK_SIZE_M of vLLM's fused MoE Triton kernel for a batch of ``num_tokens``: the
    tuned tables it ships (``fused_moe/configs/E=...,N=...,device_name=....json``, e.g.
    E=128,N=768 on H200: 16 up to 128 tokens, 32 at 256, 64 at 512, 128 from 1024) take
    about twice the mean rows per expert, a power of two from 16 to 128."""
    mean = num_tokens * experts_per_tok / num_experts
    size = 16
    while size < 2 * mean and size < 128:
        size *= 2
    return size


@lru_cache(maxsize=65536)
def padded_expert_rows(num_tokens: int, experts_per_tok: int, num_experts: int) -> float:
    """Expected rows the expert GEMMs compute per layer once each expert's share of the
    ``num_tokens × k`` pairs is padded up to a multiple of BLOCK_SIZE_M, with routing spread
    evenly (an expert's share ~ Poisson(num_tokens k / E)): E × B × Σ_j P(share > jB)."""
    from scipy.stats import poisson

    if num_tokens <= 0:
        return 0.0
    lam = num_tokens * experts_per_tok / num_experts
    b = moe_block_size_m(num_tokens, experts_per_tok, num_experts)
    top = int(lam + 8.0 * lam ** 0.5 + 2 * b) // b + 1
    tiles = float(poisson.sf(np.arange(top) * b, lam).sum())   # E[ceil(share / B)]
    return num_experts * b * tiles


class StepTimer:
    """Step durations for one replica (one memory plan, one calibration)."""

    def __init__(self, plan: MemoryPlan, calib: Calibration) -> None:
        gpu, model, tp = plan.gpu, plan.model, plan.config.tensor_parallel_size
        self.calib = calib
        self.tp = tp
        self.eager = bool(plan.config.enforce_eager)
        self.capture = cudagraph_capture_size(plan.config.max_num_seqs)
        bw = gpu.hbm_bandwidth * calib.hbm_efficiency
        fl = gpu.fp16_flops * calib.flops_efficiency
        # seconds per unit of work, per rank
        expert_bytes = model.expert_bytes(plan.quantization) / tp if model.is_moe else 0.0
        # the input embedding is a lookup of the step's rows, not a read of the table (unless
        # the LM head shares it); embeddings stay 16-bit whatever the quantisation
        lookup = 0.0 if model.tie_word_embeddings else ACTIVATION_BYTES * model.vocab_size * model.hidden_size / tp
        # the weight bytes the profile's step-time constants were fitted with (MemoryPlan)
        step = getattr(plan, "step_weight_bytes", None)
        weights = plan.weight_bytes if step is None else step
        self.s_weights = (weights - expert_bytes - lookup) / bw   # read by every step
        # read in the share the step touches, at the experts' own streaming efficiency
        moe_bw = gpu.hbm_bandwidth * (calib.moe_hbm_efficiency or calib.hbm_efficiency)
        self.s_experts = expert_bytes / moe_bw
        # the MoE layers' fixed kernel time, every step
        self.moe_fixed = model.num_layers * calib.moe_layer_s if model.is_moe else 0.0
        self.moe_keep = 1.0 - model.num_experts_per_tok / model.num_experts if model.is_moe else 1.0
        self.s_kv_token = model.kv_bytes_per_token(tp, plan.kv_cache_dtype_bytes) / bw
        expert_active = model.active_expert_params()
        lm_head = model.vocab_size * model.hidden_size
        moe_fl = fl * min(getattr(calib, "moe_flops_efficiency", 1.0), 1.0)
        # the transformer blocks' matmuls run for every scheduled token; the LM head only at
        # one position per scheduled request (vLLM's logits_indices); the embeddings' lookup
        # computes nothing
        block = model.active_param_count() - model.embedding_params() - expert_active
        self.s_token_flops = 2.0 * block / tp / fl
        self.s_seq_flops = 2.0 * lm_head / tp / fl
        # FLOPs of one token's pass through one routed expert (all layers)
        self.s_expert_flops = 2.0 * expert_active / model.num_experts_per_tok / tp / moe_fl if model.is_moe else 0.0
        self.num_experts = model.num_experts
        self.experts_per_tok = model.num_experts_per_tok
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

    def expert_rows(self, num_tokens: int) -> float:
        """Rows the routed-expert GEMMs compute for a step of ``num_tokens`` tokens (per
        layer): vLLM's fused MoE kernel sorts the ``num_tokens × k`` token-expert pairs by
        expert and pads each expert's share to a multiple of its tile height BLOCK_SIZE_M
        (``moe_align_block_size``); the padding rows are computed like the others."""
        return padded_expert_rows(num_tokens, self.experts_per_tok, self.num_experts)

    def matmul_time(self, num_tokens: int, num_seqs: int) -> float:
        """GPU seconds of a step's matmuls and the kernels between them, kernel class by
        kernel class (they run one after another, each at its own roofline): the dense
        matmuls (weights read once; FLOPs per token, and the LM head's per request) and the
        routed experts (the experts touched, the padded rows they compute)."""
        t = max(self.s_weights, self.s_token_flops * num_tokens + self.s_seq_flops * num_seqs)
        if self.s_experts:
            read = self.s_experts * (1.0 - self.moe_keep ** num_tokens)
            t += max(read, self.s_expert_flops * self.expert_rows(num_tokens)) + self.moe_fixed
        return t

    def step(self, num_tokens: int, num_seqs: int, decode_only: bool,
             ctx_tokens: float, attn_pairs: float) -> float:
        """Seconds for a step scheduling ``num_tokens`` over ``num_seqs`` requests.
        ``ctx_tokens``: KV tokens attention reads (context incl. the new tokens, summed);
        ``attn_pairs``: query-key pairs, Σ new × (computed + (new+1)/2). Attention runs after
        the matmuls at its own roofline (the KV cache read, the query-key FLOPs)."""
        if num_tokens <= 0:
            return 0.0
        gpu = self.matmul_time(num_tokens, num_seqs) if self.s_experts else max(
            self.s_weights, self.s_token_flops * num_tokens + self.s_seq_flops * num_seqs)
        gpu += max(self.s_kv_token * ctx_tokens, self.s_attn_pair * attn_pairs)
        t_launch = self.launch[self.mode(num_tokens, num_seqs, decode_only)]
        return (max(gpu, t_launch) + self.fixed + self.per_seq * num_seqs
                + self.ar_fixed + self.ar_token * num_tokens)

    def decode_run(self, n: int, ctx0: float, k: int) -> np.ndarray:
        """Durations of ``k`` consecutive decode-only steps of the same ``n`` requests whose
        computed tokens sum to ``ctx0`` before the first: step t reads ctx0 + n(t+1) tokens.
        Equal, to float rounding, to calling :meth:`step` k times."""
        t = np.arange(k, dtype=np.float64)
        ctx = ctx0 + n * (t + 1.0)
        gpu = self.matmul_time(n, n) + np.maximum(self.s_kv_token * ctx, self.s_attn_pair * ctx)
        t_launch = self.launch[self.mode(n, n, True)]
        serial = self.fixed + self.per_seq * n + self.ar_fixed + self.ar_token * n
        return np.maximum(gpu, t_launch) + serial

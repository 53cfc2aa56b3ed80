"""The designed trial set of a calibration: :class:`Trial` (a configuration and the loads
it is measured at), :class:`Probe` (one general load of a campaign), the seeded workload
of the closed-loop loads (:func:`calibration_workload`) and :func:`design_trials`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.calibrate.probes import label, synthetic
from tuner.core.errors import ConfigRejected, InputError
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.memory import plan_memory
from tuner.sim.model import load_model

if TYPE_CHECKING:
    from tuner.traffic.workload import Workload


#: Workload of every load point: prompt and output lengths drawn uniformly (seeded), the
#: same rows for the real server and the simulator. Outputs are forced (ignore_eos).
PROMPT_RANGE = (128, 1024)
OUTPUT_RANGE = (32, 256)
WORKLOAD_SEED = 2026


@dataclass(frozen=True, slots=True)
class Probe:
    """One measured load on a started configuration: a workload reference and the load
    it is offered under, both as JSON (:mod:`tuner.calibrate.probes`)."""

    workload: dict[str, Any]
    load: dict[str, Any]
    expected_s: float = 20.0    # replay time on the target GPU, to fit a probe into a lease

    @property
    def label(self) -> str:

        return label(self.workload, self.load)


@dataclass(frozen=True, slots=True)
class Trial:
    """One configuration of the design and what it is measured at: closed-loop ``loads``
    (users, on :func:`calibration_workload`) or general ``probes`` (any workload, any
    load). Both empty means startup only (the refusal case, or a KV-size-only point).
    ``model`` names the model shape (a preset) when a campaign spans several."""

    name: str
    config: ServeConfig
    loads: tuple[int, ...] = ()
    expect_refusal: bool = False
    purpose: str = ""
    probes: tuple[Probe, ...] = ()
    model: str | None = None
    start_s: float | None = None   # expected start time (default: 105 s with graphs, 70 s eager)

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in " /\\"):
            raise InputError(f"trial name {self.name!r} must be a non-empty word")
        if any(u < 1 for u in self.loads):
            raise InputError(f"trial {self.name}: loads are user counts >= 1, got {self.loads}")


def calibration_workload(n: int, *, seed: int = WORKLOAD_SEED, offset: int = 0) -> Workload:
    """``n`` requests (rows ``offset .. offset+n`` of one seeded sequence) with uniform
    prompt and output lengths (:data:`PROMPT_RANGE`, :data:`OUTPUT_RANGE`); arrivals are
    all 0 (closed-loop loads ignore them). The ``uniform`` shape of :mod:`tuner.calibrate.probes`."""

    return synthetic("uniform", n, seed=seed, offset=offset)


def requests_for(users: int, eager: bool) -> int:
    """Requests offered at ``users`` concurrent users: a few at 1 user (the decode floor is
    steady after one request; eager steps are ~4x slower), 4 per user for middle loads and
    2 per user at saturation (the ramp-down is part of the protocol, simulated alike)."""
    if users == 1:
        return 5 if eager else 10
    return 4 * users if users <= 64 else 2 * users


def _gmu_for_kv(deployment: Deployment, config: ServeConfig, kv_bytes: float) -> float:
    """The gpu_memory_utilization whose planned KV memory is about ``kv_bytes`` (bisection
    on :func:`tuner.sim.memory.plan_memory`, rounded to 0.005)."""

    lo, hi = 0.01, 0.99
    for _ in range(40):
        mid = (lo + hi) / 2
        plan = plan_memory(deployment, config.replace(gpu_memory_utilization=mid), strict=False)
        lo, hi = (mid, hi) if plan.kv_bytes < kv_bytes else (lo, mid)
    return round(round(hi / 0.005) * 0.005, 3)


def design_trials(deployment: Deployment, *, max_model_len: int = 4096) -> list[Trial]:
    """The designed trial set for ``deployment``'s GPU and model, most informative first
    (a lease that ends early still has the anchors). gpu_memory_utilization values that
    depend on the GPU's size (the KV-limited point, the refusal) are solved with the
    memory planner so the design carries over to other GPUs."""

    model = load_model(deployment.model)
    mml = max_model_len
    kv_tok = model.kv_bytes_per_token(1, 2)
    base = ServeConfig(gpu_memory_utilization=0.9, max_model_len=mml)
    long_len = model.max_position_embeddings
    refuse_cfg = ServeConfig(max_model_len=long_len, enforce_eager=True)
    # about 55% of one max-length request's KV: refused, with an estimate near 0.55 x max
    gmu_refuse = _gmu_for_kv(deployment, refuse_cfg, 0.55 * long_len * kv_tok)
    limited = ServeConfig(max_model_len=mml, max_num_seqs=512)
    # ~200k tokens: 512 users x ~700 tokens of context do not fit, so the scheduler preempts
    gmu_limited = _gmu_for_kv(deployment, limited, 200_000 * kv_tok)
    trials = [
        Trial("base", base, (1, 32, 512), purpose="vLLM defaults at gmu 0.9: the anchor"),
        Trial("eager", base.replace(enforce_eager=True), (1, 32, 512),
              purpose="eager vs CUDA graphs decode gap"),
        Trial("refuse", refuse_cfg.replace(gpu_memory_utilization=gmu_refuse), (), expect_refusal=True,
              purpose="max-model-len refusal and vLLM's estimated maximum model length"),
        Trial("seqs64", base.replace(max_num_seqs=64, max_num_batched_tokens=2048), (1, 16, 128),
              purpose="small batch cap, 2048-token chunks"),
        Trial("kvlimited", limited.replace(gpu_memory_utilization=gmu_limited), (1, 64, 512),
              purpose="KV-limited: preemption at saturation"),
        Trial("seqs16", base.replace(max_num_seqs=16), (1, 8, 32), purpose="tiny batch cap"),
        Trial("mbt1024", ServeConfig(gpu_memory_utilization=0.5, max_model_len=mml, max_num_seqs=256,
                                     max_num_batched_tokens=1024), (1, 64, 384),
              purpose="gmu 0.5, small prefill chunks"),
        Trial("eager128", ServeConfig(gpu_memory_utilization=0.7, max_model_len=mml, max_num_seqs=128,
                                      max_num_batched_tokens=512, enforce_eager=True), (1, 32, 192),
              purpose="eager with 512-token chunks"),
        Trial("mml8k", ServeConfig(gpu_memory_utilization=0.3, max_model_len=2 * mml, max_num_seqs=512,
                                   max_num_batched_tokens=4096), (1, 128, 512),
              purpose="gmu 0.3, longer max-model-len"),
        Trial("bs32", ServeConfig(gpu_memory_utilization=0.6, max_model_len=4 * mml, block_size=32), (),
              purpose="startup only: block size 32, max-model-len 16k"),
    ]
    # keep only what the model allows (a short-context model skips the long lengths)
    out = []
    for t in trials:
        if (t.config.max_model_len or 0) > long_len:
            continue
        if not t.expect_refusal:
            try:
                plan_memory(deployment, t.config)
            except ConfigRejected:
                continue
        out.append(t)
    return out


"""The embedded simulator as a backend: no process, no GPU, virtual time.

``SimBackend().start(deployment, config)`` plans memory exactly as vLLM would at startup
(raising :class:`~tuner.core.errors.ConfigRejected` where vLLM refuses) and returns a
:class:`SimInstance` whose ``run`` replays a workload in simulated time
(:func:`tuner.sim.engine.run_plan`); ``RunResult.duration_s`` is simulated seconds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.core.errors import ConfigRejected
from tuner.sim.calibration import load_calibration
from tuner.sim.engine import run_plan
from tuner.sim.memory import plan_memory

if TYPE_CHECKING:
    from tuner.runtime.control import StopHook
    from tuner.serving.config import Deployment, ServeConfig
    from tuner.serving.load import Load
    from tuner.serving.result import RunResult
    from tuner.sim.calibration import Calibration
    from tuner.sim.memory import MemoryPlan
    from tuner.traffic.workload import Workload

# Estimated wall time of a real ``vllm serve`` start, seconds. Anchor: vLLM 0.26.0 on one
# H200 (Qwen2.5-7B shape, dummy weights) took 50-105 s from process start to a healthy
# /health, with "Graph capturing finished in 3 secs" (benchmarks/h200/README.md).
STARTUP_BASE_S = 35.0            # interpreter, imports, CUDA/NCCL init, profile run, API server
STARTUP_COMPILE_S = 20.0         # torch.compile (cache warm) — skipped by --enforce-eager
STARTUP_GRAPHS_S = 3.0           # CUDA graph capture (H200 log: 3 s)
STARTUP_LOAD_BYTES_PER_S = 1.5e9  # weights read from local disk / page cache, per rank


def estimate_startup_s(plan: MemoryPlan) -> float:
    """Seconds a real vLLM start would take for ``plan`` (see the constants above):
    ~68 s for a 7B model on one H200 with CUDA graphs, inside the measured 50-105 s."""
    t = STARTUP_BASE_S + plan.weight_bytes / STARTUP_LOAD_BYTES_PER_S
    if not plan.config.enforce_eager:
        t += STARTUP_COMPILE_S + STARTUP_GRAPHS_S
    return t


class SimInstance:
    """A simulated deployment: ``replicas`` engines of one memory plan behind a router."""

    def __init__(self, plan: MemoryPlan, replicas: int, *, router: str = "round_robin",
                 record_itl: bool = False, profile: Calibration | None = None) -> None:

        self.plan = plan
        self.replicas = replicas
        self.router = router
        self.record_itl = record_itl
        self.profile = profile if profile is not None else load_calibration(plan.gpu, vllm_version=plan.vllm_version)
        self.closed = False
        self.info: dict[str, Any] = {
            "kv_cache_tokens": plan.kv_cache_tokens,
            "num_gpu_blocks": plan.num_gpu_blocks,
            "max_concurrency": plan.max_concurrency,
            "startup_s": estimate_startup_s(plan),
            "vllm_version": plan.vllm_version,
            "log_paths": [],
            "argv": [],
            "log_lines": plan.log_lines(),
            "calibration": self.profile.gpu_class,
        }

    def run(self, workload: Workload, load: Load, *, stop: StopHook | None = None) -> RunResult:

        return run_plan(self.plan, workload, load, replicas=self.replicas, router=self.router,
                        stop=stop, record_itl=self.record_itl, profile=self.profile)

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> SimInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SimBackend:
    """Backend ``sim``: the embedded simulator of vLLM (virtual time: a trial costs no GPU)."""

    name = "sim"
    restarts = True
    measures_gpu_time = False
    launched_at: float | None = None  # it holds no GPU
    simulated = True
    time_scale = 1.0  # RunResult times are already the simulated GPU's

    def __init__(self, *, router: str = "round_robin", record_itl: bool = False,
                 profile: Calibration | None = None) -> None:
        self.router = router
        self.record_itl = record_itl
        self.profile = profile

    def _plan(self, deployment: Deployment, config: ServeConfig) -> MemoryPlan:

        if config.gpus_needed > deployment.gpu_count:
            raise ConfigRejected(
                "layout",
                f"tensor_parallel_size {config.tensor_parallel_size} x replicas {config.replicas} "
                f"needs {config.gpus_needed} GPUs; the deployment has {deployment.gpu_count}",
            )
        return plan_memory(deployment, config)

    def preflight(self, deployment: Deployment) -> None:
        """Nothing to check before a study: every refusal is the configuration's."""

    def precheck(self, deployment: Deployment, config: ServeConfig) -> dict[str, Any]:
        plan = self._plan(deployment, config)
        facts = plan.summary()
        facts["startup_s"] = estimate_startup_s(plan)
        return facts

    def start(self, deployment: Deployment, config: ServeConfig) -> SimInstance:

        plan = self._plan(deployment, config)
        profile = self.profile
        if profile is None:
            profile = load_calibration(plan.gpu, deployment.calibration, plan.vllm_version)
        return SimInstance(plan, config.replicas, router=self.router,
                           record_itl=self.record_itl, profile=profile)

"""Stand-ins for backends, shared by the tests: each meets the protocol the search and the
planner declare (:mod:`tuner.search.backend`); ``tests/backends/test_contract.py`` runs the
one contract suite against each of them, as against the real backends."""
from __future__ import annotations

import dataclasses

import numpy as np

from tuner.core.errors import BackendError, ConfigRejected
from tuner.runtime.control import RunControl
from tuner.serving.config import ServeConfig
from tuner.serving.load import Concurrency, Poisson
from tuner.serving.result import RunResult
from tuner.traffic.workload import Workload


def small_workload(n: int = 60) -> Workload:
    rng = np.random.default_rng(0)
    return Workload(
        arrival_s=np.arange(n) * 0.1,
        prompt_tokens=rng.integers(50, 300, n),
        output_tokens=rng.integers(20, 200, n),
        source="test",
    )

class FakeInstance:
    """Analytic server: P95 TTFT = ``ttft_per_user`` x users (x 1/rate-capacity for open
    loop), throughput grows with users until max_num_seqs x replicas."""

    def __init__(self, config: ServeConfig, ttft_per_user: float, crash: bool = False) -> None:
        self.config = config
        self.ttft_per_user = ttft_per_user
        self.crash = crash
        self.info = {"startup_s": 30.0, "kv_cache_tokens": 10**6, "vllm_version": "0.0-fake", "log_paths": ["/tmp/fake.log"]}  # noqa: E501
        self.runs: list[str] = []
        self.closed = 0

    def run(self, workload, load, *, stop=None) -> RunResult:
        if self.crash:
            raise BackendError("fake server died")
        self.runs.append(load.label)
        cap = self.config.max_num_seqs * self.config.replicas
        users = load.users if isinstance(load, Concurrency) else load.rate * 2.0
        n = len(workload)
        ttft = np.full(n, self.ttft_per_user * users / self.config.replicas)
        ttft *= np.linspace(0.5, 1.05, n)  # P95 ≈ the nominal value
        control = RunControl(total=n)
        errors: list[str | None] = [None] * n
        stopped = False
        for i in range(n):
            control.finished += 1
            control.ttft_s.append(float(ttft[i]))
            if stop is not None and stop(control):
                stopped = True
                errors[i + 1:] = ["not_sent"] * (n - i - 1)
                ttft[i + 1:] = np.nan
                break
        tokens = float((workload.prompt_tokens + workload.output_tokens).sum())
        tps = 100.0 * min(users, cap)
        done = (i + 1) / n
        return RunResult(
            send_s=np.zeros(n), ttft_s=ttft, e2e_s=ttft + 1.0,
            prompt_tokens=workload.prompt_tokens, output_tokens=workload.output_tokens,
            error=errors, duration_s=tokens / tps * done, server={"num_preemptions": 0},
            stopped_early=stopped, load_label=load.label,
        )

    def close(self) -> None:
        self.closed += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

class FakeBackend:
    """Rejects gpu_memory_utilization > 0.9 (as an OOM) and crashes on enforce_eager.
    Analytic: nothing it does costs a GPU (the search does not predict for it)."""

    name = "fake"
    restarts = True
    measures_gpu_time = False
    simulated = False
    time_scale = 1.0

    def __init__(self, ttft_per_user: float = 0.01) -> None:
        self.ttft_per_user = ttft_per_user
        self.started: list[ServeConfig] = []
        self.instances: list[FakeInstance] = []

    def preflight(self, deployment):
        pass

    def precheck(self, deployment, config):
        if (config.gpu_memory_utilization or 0.9) > 0.9:
            raise ConfigRejected("oom", "CUDA out of memory (fake)")
        return {"max_num_seqs": config.max_num_seqs, "kv_cache_tokens": 10**6}

    def start(self, deployment, config):
        self.started.append(config)
        inst = FakeInstance(config, self.ttft_per_user, crash=config.enforce_eager)
        self.instances.append(inst)
        return inst

class ErrorInstance(FakeInstance):
    """Every ``every``-th request fails with ``kind`` (all when every=1); the rest take
    0.1 s to their first token. Honours the stop hook like a replay: a failed request
    finishes without a TTFT."""

    def __init__(self, config, kind: str, every: int) -> None:
        super().__init__(config, 0.0)
        self.kind, self.every = kind, every

    def run(self, workload, load, *, stop=None) -> RunResult:
        n = len(workload)
        control = RunControl(total=n)
        errors: list[str | None] = ["not_sent"] * n
        ttft = np.full(n, np.nan)
        stopped = False
        for i in range(n):
            control.finished += 1
            if i % self.every == 0:
                errors[i] = self.kind
            else:
                errors[i], ttft[i] = None, 0.1
                control.ttft_s.append(0.1)
            if stop is not None and stop(control):
                stopped = True
                break
        return RunResult(send_s=np.zeros(n), ttft_s=ttft, e2e_s=ttft + 1.0, prompt_tokens=workload.prompt_tokens,
                         output_tokens=workload.output_tokens, error=errors, duration_s=10.0, stopped_early=stopped,
                         load_label=load.label, error_detail={self.kind: "rate limit reached"})

class ErrorBackend(FakeBackend):
    def __init__(self, kind: str = "http_429", every: int = 1) -> None:
        super().__init__()
        self.kind, self.every = kind, every

    def start(self, deployment, config):
        inst = ErrorInstance(config, self.kind, self.every)
        self.instances.append(inst)
        return inst

# -- the search: common random numbers, confirmation stored, resumed ---------------------------
class NoisyBackend(FakeBackend):
    """The fake server with run-to-run noise: each start draws a throughput factor
    (sd ``sd``), and every knob but the layout and max-num-seqs is without effect. It
    records the seeds of the Poisson loads it is offered and the order of the requests."""

    name = "noisy"

    def __init__(self, sd: float = 0.02, seed: int = 0) -> None:
        super().__init__(ttft_per_user=0.01)
        self.rng = np.random.default_rng(seed)
        self.sd = sd
        self.seeds: list[int] = []
        self.orders: list[tuple[int, ...]] = []

    def start(self, deployment, config):
        self.started.append(config)
        factor = float(np.exp(self.rng.normal(0.0, self.sd)))
        backend = self

        class Inst(FakeInstance):
            def run(self, workload, load, *, stop=None):
                if isinstance(load, Poisson):
                    backend.seeds.append(load.seed)
                backend.orders.append(tuple(int(x) for x in workload.prompt_tokens[:5]))
                result = super().run(workload, load, stop=stop)
                return dataclasses.replace(result, duration_s=result.duration_s / factor)

        inst = Inst(config, self.ttft_per_user)
        self.instances.append(inst)
        return inst


class Analytic:
    """P95 TTFT = ``f(users)`` exactly (every request waits that long); 100 tokens/s per user."""

    name = "analytic"
    restarts = True
    measures_gpu_time = False
    simulated = False
    time_scale = 1.0

    def __init__(self, f):
        self.f = f
        self.runs: list[float] = []
        self.info = {"startup_s": 0.0}

    def preflight(self, deployment):
        pass

    def precheck(self, deployment, config):
        return {}

    def start(self, deployment, config):
        return self

    def close(self):
        pass

    def run(self, workload, load, *, stop=None):
        level = load.users if isinstance(load, Concurrency) else load.rate
        self.runs.append(level)
        n = len(workload)
        ttft = np.full(n, float(self.f(level)))
        errors: list[str | None] = [None] * n
        control = RunControl(total=n)
        for i in range(n):  # requests end in order; the stop hook sees each
            control.sent = control.finished = i + 1
            control.ttft_s.append(float(ttft[i]))
            if stop is not None and stop(control):
                errors[i + 1:] = ["not_sent"] * (n - i - 1)
                ttft[i + 1:] = np.nan
                break
        tokens = float((workload.prompt_tokens + workload.output_tokens).sum())
        return RunResult(send_s=np.zeros(n), ttft_s=ttft, e2e_s=ttft + 2.0, prompt_tokens=workload.prompt_tokens,
                         output_tokens=workload.output_tokens, error=errors,
                         duration_s=tokens / (100.0 * level), stopped_early=control.finished < n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

class LateWatch:
    """The vLLM backend, reading sim-serve's ``/debug/loop`` after every run: how late the
    engine loop's steps ended (a busy machine makes the server slower than simulated time).
    Also benchmarks/plan_agreement.py's; ``strict``: a failed reading raises instead of
    recording no lateness (a benchmark prints the figure, so it must have been read)."""

    def __init__(self, backend, strict: bool = False):
        self.backend = backend
        self.name = backend.name
        self.late_p95_s = 0.0
        self.strict = strict

    def __getattr__(self, name):  # the rest of the protocol (capabilities, preflight) is the backend's
        return getattr(self.backend, name)

    def precheck(self, deployment, config):
        return self.backend.precheck(deployment, config)

    def start(self, deployment, config):
        import json as _json
        import urllib.request

        inst = self.backend.start(deployment, config)
        inner_run = inst.run

        def run(workload, load, *, stop=None):
            result = inner_run(workload, load, stop=stop)
            for url in inst.urls:
                try:
                    with urllib.request.urlopen(f"{url}/debug/loop", timeout=10) as resp:
                        self.late_p95_s = max(self.late_p95_s, float(_json.load(resp).get("late_p95_s", 0.0)))
                except (OSError, ValueError):  # a sim-serve without /debug/loop: no excuse recorded
                    if self.strict:
                        raise
            return result

        inst.run = run
        return inst


class PerStartNoise:
    """A server whose every request at ``users`` waits ``base[max_num_seqs] x (1 + 0.5 x
    (users - 1))`` s to its first token, times a factor drawn once per START (lognormal,
    sd ``sd``: every replay of one start shares it, as a server's TTFT does), and serves
    ``speed[max_num_seqs]`` tokens/s per user. ``draws`` records each start's
    (max_num_seqs, factor)."""

    name = "per-start-noise"
    restarts = True
    measures_gpu_time = False
    simulated = False
    time_scale = 1.0

    def __init__(self, base: dict[int, float], speed: dict[int, float], sd: float = 0.10, seed: int = 0) -> None:
        self.base, self.speed, self.sd = base, speed, sd
        self.rng = np.random.default_rng(seed)
        self.draws: list[tuple[int, float]] = []

    def preflight(self, deployment):
        pass

    def precheck(self, deployment, config):
        return {}

    def start(self, deployment, config):
        factor = float(np.exp(self.rng.normal(0.0, self.sd)))
        self.draws.append((config.max_num_seqs, factor))
        seqs = config.max_num_seqs
        inst = Analytic(lambda users: self.base[seqs] * (1 + 0.5 * (users - 1)) * factor)
        speed = self.speed[seqs]
        run = inst.run

        def scaled(workload, load, *, stop=None):
            result = run(workload, load, stop=stop)
            return dataclasses.replace(result, duration_s=result.duration_s * 100.0 / speed)

        inst.run = scaled  # type: ignore[method-assign]
        return inst

"""SimBackend: the Backend contract over the simulator (precheck, start, run, close)."""
from __future__ import annotations

import numpy as np
import pytest

from tuner.backends.sim import SimBackend
from tuner.core.errors import ConfigRejected
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency, Poisson
from tuner.traffic.workload import Workload

H200 = Deployment(model="qwen2.5-7b", gpu="H200", gpu_count=2)


def workload(n: int = 40) -> Workload:
    rng = np.random.default_rng(1)
    return Workload(arrival_s=np.zeros(n), prompt_tokens=rng.integers(100, 2000, n),
                    output_tokens=rng.integers(10, 300, n))


def test_precheck_and_start_report_vllm_startup_facts() -> None:
    backend = SimBackend()
    cfg = ServeConfig(gpu_memory_utilization=0.9, max_model_len=4096)
    facts = backend.precheck(H200, cfg)
    with backend.start(H200, cfg) as inst:
        # H200 log (vLLM 0.26.0): "GPU KV cache size: 2,064,240 tokens" at these settings
        assert inst.info["kv_cache_tokens"] == pytest.approx(2_064_240, rel=0.01)
        assert inst.info["num_gpu_blocks"] == facts["num_gpu_blocks"]
        # a real start took 50-105 s on the H200 (../shared/tools/h200-vllm/README.md)
        assert 50 <= inst.info["startup_s"] <= 105
        res = inst.run(workload(), Concurrency(8))
    assert inst.closed
    assert res.ok.all() and res.duration_s > 0
    eager = backend.precheck(H200, cfg.replace(enforce_eager=True))["startup_s"]
    assert eager < facts["startup_s"]           # no compile, no graph capture


def test_refusals_surface_before_anything_runs() -> None:
    backend = SimBackend()
    with pytest.raises(ConfigRejected) as err:
        backend.precheck(H200, ServeConfig(gpu_memory_utilization=0.12, max_model_len=32768))
    assert err.value.kind == "max_model_len"
    with pytest.raises(ConfigRejected) as err:
        backend.start(H200, ServeConfig(tensor_parallel_size=2, replicas=2))
    assert err.value.kind == "layout"


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
def test_two_replicas_double_capacity(router: str) -> None:
    w = workload(200)
    one = SimBackend(router=router).start(H200, ServeConfig(replicas=1)).run(w, Concurrency(64))
    two = SimBackend(router=router).start(H200, ServeConfig(replicas=2)).run(w, Concurrency(64))
    ratio = two.summary()["tokens_per_s"] / one.summary()["tokens_per_s"]
    assert 1.3 < ratio <= 2.05
    assert two.server["replicas"] == 2


def test_stop_hook_ends_a_run_early() -> None:
    seen = []

    def stop(control) -> bool:
        seen.append(control.finished)
        return control.finished >= 10

    with SimBackend().start(H200, ServeConfig()) as inst:
        res = inst.run(workload(100), Poisson(rate=50.0), stop=stop)
    assert res.stopped_early and seen == list(range(1, 11))
    assert sum(e is None for e in res.error) == 10
    assert res.error.count("not_sent") + res.error.count("cancelled") == 90  # what the stop did, not failures

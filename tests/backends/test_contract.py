"""One contract, every backend: the protocol the search and the planner declare
(:mod:`tuner.search.backend`) holds for the simulator, for real processes (``vllm`` on
``tuner sim-serve``), for a server someone else runs (``endpoint`` on a running
sim-serve) and for every stand-in the tests use (``tests/fakes.py``)."""
from __future__ import annotations

import collections

import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fakes import Analytic, ErrorBackend, FakeBackend, LateWatch, NoisyBackend, PerStartNoise

from tuner.backends.endpoint import EndpointBackend
from tuner.backends.local_server import free_port, start_local_server
from tuner.backends.sim import SimBackend
from tuner.backends.vllm import VllmBackend
from tuner.config import Deployment, ServeConfig
from tuner.control import RunControl
from tuner.errors import ConfigRejected
from tuner.load import Concurrency
from tuner.result import RunResult
from tuner.traffic.workload import Workload

pytestmark = pytest.mark.usefixtures("no_leftover_processes")  # tests/conftest.py

SIM_SERVE = f"{sys.executable} -m tuner.sim.server --speed 20"
DEPLOYMENT = Deployment(model="qwen2.5-7b", gpu="H100-SXM")
CONFIG = ServeConfig(max_num_seqs=16, max_model_len=4096)


@dataclass
class Case:
    """A backend under contract, with a configuration it starts and one it refuses (None
    when it applies no configuration, or refuses none)."""

    backend: Any
    refused: ServeConfig | None = None


@pytest.fixture(scope="module")
def sim_serve_url() -> Iterator[str]:
    """A sim-serve someone else runs (the endpoint backend's server)."""
    port = free_port()
    proc, url = start_local_server([sys.executable, "-m", "tuner.sim.server", "qwen2.5-7b", "--port", str(port),
                                    "--max-model-len", "4096", "--speed", "20"], port, what="sim-serve",
                                   timeout_s=60)
    yield url
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _vllm(tmp_path: Any) -> VllmBackend:
    return VllmBackend(vllm_cmd=SIM_SERVE, log_dir=tmp_path / "logs", startup_timeout_s=120, stop_grace_s=5)


#: name -> how to make the case (the real backends, then every stand-in of tests/fakes.py).
CASES: dict[str, Callable[..., Case]] = {
    "sim": lambda tmp, url: Case(SimBackend(), refused=ServeConfig(gpu_memory_utilization=0.1)),
    "vllm-on-sim-serve": lambda tmp, url: Case(_vllm(tmp), refused=ServeConfig(gpu_memory_utilization=0.1)),
    "endpoint-on-sim-serve": lambda tmp, url: Case(EndpointBackend([url])),
    "fake": lambda tmp, url: Case(FakeBackend(), refused=ServeConfig(gpu_memory_utilization=0.95)),
    "fake-errors": lambda tmp, url: Case(ErrorBackend(every=3), refused=ServeConfig(gpu_memory_utilization=0.95)),
    "fake-noisy": lambda tmp, url: Case(NoisyBackend(), refused=ServeConfig(gpu_memory_utilization=0.95)),
    "analytic": lambda tmp, url: Case(Analytic(lambda users: 0.05 * users)),
    "per-start-noise": lambda tmp, url: Case(PerStartNoise(collections.defaultdict(lambda: 0.05),
                                                           collections.defaultdict(lambda: 40.0))),
    "late-watch-on-sim-serve": lambda tmp, url: Case(LateWatch(_vllm(tmp)),
                                                     refused=ServeConfig(gpu_memory_utilization=0.1)),
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Any, sim_serve_url: str) -> Case:
    return CASES[request.param](tmp_path, sim_serve_url)


def workload(n: int = 12) -> Workload:
    rng = np.random.default_rng(0)
    return Workload(arrival_s=np.zeros(n), prompt_tokens=rng.integers(100, 400, n),
                    output_tokens=rng.integers(5, 20, n), source="contract")


def test_it_declares_what_it_can_instead_of_a_name_to_branch_on(case):
    b = case.backend
    assert isinstance(b.name, str) and b.name
    assert all(isinstance(getattr(b, cap), bool) for cap in ("restarts", "measures_gpu_time", "simulated"))
    assert math.isfinite(b.time_scale) and b.time_scale > 0
    assert b.preflight(DEPLOYMENT) is None


def test_precheck_answers_with_facts_and_starts_nothing(case):
    assert isinstance(case.backend.precheck(DEPLOYMENT, CONFIG), dict)


def test_a_started_instance_runs_a_load_with_one_result_per_request_and_closes_once(case):
    w = workload()
    instance = case.backend.start(DEPLOYMENT, CONFIG)
    with instance as inst:
        assert isinstance(inst.info, dict) and float(inst.info.get("startup_s", 0.0)) >= 0.0
        result = inst.run(w, Concurrency(4))
    instance.close()  # a second close is harmless
    assert isinstance(result, RunResult) and len(result.error) == len(w) and len(result.ttft_s) == len(w)
    assert result.duration_s > 0 and not result.stopped_early
    summary = result.summary()
    assert summary["requests"] == len(w) and summary["tokens_per_s"] >= 0


def test_the_stop_hook_sees_the_run_grow_and_ends_it_early(case):
    w = workload(40)
    seen: list[tuple[int, int, int]] = []

    def stop(control: RunControl) -> bool:
        seen.append((control.sent, control.finished, control.total))
        return control.finished >= 5

    with case.backend.start(DEPLOYMENT, CONFIG) as inst:
        result = inst.run(w, Concurrency(2), stop=stop)
    assert result.stopped_early
    assert sum(e is None for e in result.error) < len(w)  # the rest were never sent, or were cancelled
    finished = [f for _, f, _ in seen]
    assert finished == sorted(finished) and finished[-1] >= 5
    assert all(total == len(w) and sent <= total for sent, _, total in seen)


def test_each_run_sends_requests_no_earlier_run_sent(case):
    """A server that reports its prefix cache finds nothing of the first run in it on the second."""
    w = workload()
    with case.backend.start(DEPLOYMENT, CONFIG) as inst:
        inst.run(w, Concurrency(4))
        again = inst.run(w, Concurrency(4))
    if "prefix_cache_hits" not in again.server:
        pytest.skip(f"{case.backend.name} reports no prefix cache")
    assert again.server["prefix_cache_hits"] == 0


def test_a_configuration_vllm_refuses_is_refused_before_or_at_start_and_leaves_nothing(case):
    if case.refused is None:
        pytest.skip(f"{case.backend.name} refuses no configuration (restarts: {case.backend.restarts})")
    with pytest.raises(ConfigRejected):
        case.backend.precheck(DEPLOYMENT, case.refused)
        case.backend.start(DEPLOYMENT, case.refused).close()


def test_every_stand_in_of_the_tests_is_under_contract():
    """A new stand-in in tests/fakes.py joins CASES (a class whose instances start deployments)."""
    import fakes

    stand_ins = {name for name, obj in vars(fakes).items()
                 if isinstance(obj, type) and callable(getattr(obj, "start", None))}
    covered = {type(make(None, "").backend).__name__ for key, make in CASES.items()
               if not key.endswith("sim-serve") and key != "sim"} | {"LateWatch"}
    assert stand_ins <= covered, f"add to CASES: {sorted(stand_ins - covered)}"

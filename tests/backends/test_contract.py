"""One contract, every backend: :class:`tuner.testing.BackendContract`, the checks of the
protocol the search and the planner declare (:mod:`tuner.search.backend`), runs on the
simulator, on real processes (``vllm`` on ``tuner sim-serve``), on a server someone else
runs (``endpoint`` on a running sim-serve) and on every stand-in the tests use
(``tests/fakes.py``); a backend written elsewhere subclasses it the same way."""
from __future__ import annotations

import collections
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fakes import Analytic, ErrorBackend, FakeBackend, LateWatch, NoisyBackend, PerStartNoise

from tuner.backends.endpoint import EndpointBackend
from tuner.backends.local_server import free_port, start_local_server
from tuner.backends.sim import SimBackend
from tuner.backends.vllm import VllmBackend
from tuner.serving.config import ServeConfig
from tuner.testing import BackendContract

SIM_SERVE = f"{sys.executable} -m tuner.sim.server --speed 20"


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


class TestEveryBackend(BackendContract):
    """The contract on each of :data:`CASES`."""

    @pytest.fixture(params=sorted(CASES))
    def backend(self, request: pytest.FixtureRequest, tmp_path: Any, sim_serve_url: str) -> Any:
        case = CASES[request.param](tmp_path, sim_serve_url)
        self.refused = case.refused
        return case.backend


class TestAThirdPartyBackend(BackendContract):
    """The way a backend written elsewhere runs the contract: one method."""

    refused = ServeConfig(gpu_memory_utilization=0.1)

    def make_backend(self) -> SimBackend:
        return SimBackend()


def test_a_backend_that_breaks_the_contract_fails_it():
    """The contract can fail: a backend whose run loses a request is caught."""
    class Lossy(FakeBackend):
        def start(self, deployment, config):
            inst = super().start(deployment, config)
            run = inst.run
            inst.run = lambda w, load, stop=None: run(w.take(slice(0, len(w) - 1)), load, stop=stop)
            return inst

    contract = BackendContract()
    with pytest.raises(AssertionError):
        contract.test_a_started_instance_runs_a_load_with_one_result_per_request_and_closes_once(Lossy())


def test_every_stand_in_of_the_tests_is_under_contract():
    """A new stand-in in tests/fakes.py joins CASES (a class whose instances start deployments)."""
    import fakes

    stand_ins = {name for name, obj in vars(fakes).items()
                 if isinstance(obj, type) and callable(getattr(obj, "start", None))}
    covered = {type(make(None, "").backend).__name__ for key, make in CASES.items()
               if not key.endswith("sim-serve") and key != "sim"} | {"LateWatch"}
    assert stand_ins <= covered, f"add to CASES: {sorted(stand_ins - covered)}"

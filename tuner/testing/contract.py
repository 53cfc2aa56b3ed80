"""The backend contract as a pytest class: subclass :class:`BackendContract`, name the
subclass ``Test...`` and say how to make the backend; pytest runs every check on it.

A backend meets the protocol of :mod:`tuner.search.backend` without importing it; these
checks are what "meets" means: capabilities instead of a name, a precheck that starts
nothing, one result per request, a stop hook that ends a run early, a fresh prompt set per
run, a refused configuration refused before or at start, and no process left behind.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest

from tuner.core.errors import ConfigRejected
from tuner.runtime.control import RunControl
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency
from tuner.serving.result import RunResult
from tuner.testing.processes import no_leftover_processes
from tuner.traffic.workload import Workload


def contract_workload(n: int = 12) -> Workload:
    """``n`` short requests, all at time 0 (the load decides when they are sent)."""
    rng = np.random.default_rng(0)
    return Workload(arrival_s=np.zeros(n), prompt_tokens=rng.integers(100, 400, n),
                    output_tokens=rng.integers(5, 20, n), source="contract")


class BackendContract:
    """The checks every backend passes. A subclass defines :meth:`make_backend` and, when
    the backend applies configurations and refuses some, :attr:`refused`; it may change
    :attr:`deployment` and :attr:`config` (the configuration started)."""

    deployment: ClassVar[Deployment] = Deployment(model="qwen2.5-7b", gpu="H100-SXM")
    config: ClassVar[ServeConfig] = ServeConfig(max_num_seqs=16, max_model_len=4096)
    #: A configuration the backend refuses with ``ConfigRejected`` at ``precheck`` or
    #: ``start``; None when it applies none (``restarts`` False) or refuses none.
    refused: ServeConfig | None = None

    def make_backend(self) -> Any:
        """A fresh backend for one check."""
        raise NotImplementedError(f"{type(self).__name__} must define make_backend(self)")

    @pytest.fixture(autouse=True)
    def _no_leftover_processes(self) -> Iterator[None]:
        with no_leftover_processes():
            yield

    @pytest.fixture
    def backend(self) -> Any:
        """The backend under contract (override this fixture to make it from other fixtures)."""
        return self.make_backend()

    def test_it_declares_what_it_can_instead_of_a_name_to_branch_on(self, backend: Any) -> None:
        assert isinstance(backend.name, str) and backend.name
        assert all(isinstance(getattr(backend, cap), bool) for cap in ("restarts", "measures_gpu_time", "simulated"))
        assert math.isfinite(backend.time_scale) and backend.time_scale > 0
        assert backend.preflight(self.deployment) is None

    def test_precheck_answers_with_facts_and_starts_nothing(self, backend: Any) -> None:
        assert isinstance(backend.precheck(self.deployment, self.config), dict)

    def test_a_started_instance_runs_a_load_with_one_result_per_request_and_closes_once(self, backend: Any) -> None:
        w = contract_workload()
        instance = backend.start(self.deployment, self.config)
        with instance as inst:
            assert isinstance(inst.info, dict) and float(inst.info.get("startup_s", 0.0)) >= 0.0
            result = inst.run(w, Concurrency(4))
        instance.close()  # a second close is harmless
        assert isinstance(result, RunResult) and len(result.error) == len(w) and len(result.ttft_s) == len(w)
        assert result.duration_s > 0 and not result.stopped_early
        summary = result.summary()
        assert summary["requests"] == len(w) and summary["tokens_per_s"] >= 0

    def test_the_stop_hook_sees_the_run_grow_and_ends_it_early(self, backend: Any) -> None:
        w = contract_workload(40)
        seen: list[tuple[int, int, int]] = []

        def stop(control: RunControl) -> bool:
            seen.append((control.sent, control.finished, control.total))
            return control.finished >= 5

        with backend.start(self.deployment, self.config) as inst:
            result = inst.run(w, Concurrency(2), stop=stop)
        assert result.stopped_early
        assert sum(e is None for e in result.error) < len(w)  # the rest were never sent, or were cancelled
        finished = [f for _, f, _ in seen]
        assert finished == sorted(finished) and finished[-1] >= 5
        assert all(total == len(w) and sent <= total for sent, _, total in seen)

    def test_each_run_sends_requests_no_earlier_run_sent(self, backend: Any) -> None:
        """A server that reports its prefix cache finds nothing of the first run in it on the second."""
        w = contract_workload()
        with backend.start(self.deployment, self.config) as inst:
            inst.run(w, Concurrency(4))
            again = inst.run(w, Concurrency(4))
        if "prefix_cache_hits" not in again.server:
            pytest.skip(f"{backend.name} reports no prefix cache")
        assert again.server["prefix_cache_hits"] == 0

    def test_a_configuration_vllm_refuses_is_refused_before_or_at_start_and_leaves_nothing(self, backend: Any) -> None:
        if self.refused is None:
            pytest.skip(f"{backend.name} refuses no configuration (restarts: {backend.restarts})")
        with pytest.raises(ConfigRejected):
            backend.precheck(self.deployment, self.refused)
            backend.start(self.deployment, self.refused).close()


__all__ = ["BackendContract", "contract_workload"]

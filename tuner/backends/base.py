"""The contract every backend meets (declared here, where the search and the planner
use it; backends depend on this module, never the reverse).

A :class:`Backend` turns a :class:`ServeConfig` into a running :class:`Instance`
(``start``), or raises :class:`~tuner.errors.ConfigRejected` when vLLM refuses, or would
refuse, to start. ``precheck`` answers the same question without starting anything
(the simulator's memory planner) and costs no GPU time. An :class:`Instance` runs loads
and is closed exactly once; closing leaves no process behind.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tuner.config import Deployment, ServeConfig
    from tuner.load import Load
    from tuner.result import RunResult
    from tuner.traffic.workload import Workload


@dataclass(slots=True)
class RunControl:
    """Live view of a run, handed to the caller's ``stop`` hook after each request ends.

    ``stop(control) -> True`` ends the run early (the search uses it once P95 TTFT is
    lost beyond recovery). Counts are of requests; times are seconds since the run began.
    """

    sent: int = 0
    finished: int = 0
    total: int = 0
    elapsed_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)


StopHook = Callable[[RunControl], bool]


class Instance(Protocol):
    """A started deployment (one or more replicas behind a router)."""

    #: Startup facts: ``kv_cache_tokens``, ``num_gpu_blocks``, ``max_concurrency``,
    #: ``startup_s`` (seconds a real start takes or would take), ``vllm_version``,
    #: ``log_paths``, ``argv``.
    info: dict[str, Any]

    def run(self, workload: Workload, load: Load, *, stop: StopHook | None = None) -> RunResult: ...

    def close(self) -> None: ...

    def __enter__(self) -> Instance: ...

    def __exit__(self, *exc: object) -> None: ...


class Backend(Protocol):
    name: str

    def precheck(self, deployment: Deployment, config: ServeConfig) -> dict[str, Any]:
        """Memory-plan facts for the config; raises ConfigRejected if vLLM would refuse."""
        ...

    def start(self, deployment: Deployment, config: ServeConfig) -> Instance:
        """Start (or attach to) the deployment; raises ConfigRejected on a refused start."""
        ...

"""What the search and the planner need of a backend, declared here by them: the backends
(:mod:`tuner.backends`) and every stand-in meet it without importing it, and one contract
suite (``tests/backends/test_contract.py``) checks each against it.

A :class:`Backend` turns a :class:`~tuner.serving.config.ServeConfig` into a running
:class:`Instance` (``start``), or raises :class:`~tuner.core.errors.ConfigRejected` when vLLM
refuses, or would refuse, to start. ``precheck`` answers the same question without
starting anything and costs no GPU time; ``preflight`` checks, before any study is
written, what must hold for every trial (a command that exists, a URL that answers).

Callers never branch on ``name`` (it is recorded on trials, in study names and reports);
what differs between backends is said by their capabilities:

* ``restarts`` — ``start`` launches a server with the trial's configuration (``sim``,
  ``vllm``); ``False``: a server someone else runs, the configuration is not applied
  (``endpoint``).
* ``measures_gpu_time`` — a start and a replay take real GPU time (``vllm``,
  ``endpoint``): worth a prediction before launching (:mod:`tuner.search.prediction`), and a
  refused start costs its wall time. ``False`` for the simulator's virtual time.
* ``simulated`` — the numbers come from tuner's simulator (``sim``, or ``vllm`` running
  ``tuner sim-serve``): the deployment's GPU must be in tuner's catalog.
* ``time_scale`` — seconds of the simulated GPU per second a run takes
  (``tuner sim-serve --speed 20``: 20); 1 for real time and for virtual time.

An :class:`Instance` runs loads and is closed exactly once; closing leaves no process
behind. Each ``run`` sends prompts no earlier run of any instance sent (a fresh salt, or a
fresh simulated engine), so a server's prefix cache never serves one run from another.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tuner.serving.result import StartupInfo

if TYPE_CHECKING:
    from tuner.runtime.control import StopHook
    from tuner.serving.config import Deployment, ServeConfig
    from tuner.serving.load import Load
    from tuner.serving.result import RunResult
    from tuner.traffic.workload import Workload


class Instance(Protocol):
    """A started deployment (one or more replicas behind a router)."""

    info: StartupInfo

    def run(self, workload: Workload, load: Load, *, stop: StopHook | None = None) -> RunResult:
        """Replay ``load``: one result per request of ``workload``; ``stop(control) -> True``
        ends the run early (``RunResult.stopped_early``)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Instance: ...

    def __exit__(self, *exc: object) -> None: ...


class Backend(Protocol):
    name: str
    restarts: bool
    measures_gpu_time: bool
    simulated: bool
    time_scale: float
    #: Where ``measures_gpu_time``: when (``time.monotonic()``) the server its last start
    #: launched began holding the GPUs, ``None`` before any (what a failed trial throws away).
    launched_at: float | None

    def preflight(self, deployment: Deployment) -> None:
        """Before any study is written; raises :class:`~tuner.core.errors.EnvironmentFault` or
        :class:`~tuner.core.errors.InputError` when no trial could run."""
        ...

    def precheck(self, deployment: Deployment, config: ServeConfig) -> dict[str, Any]:
        """Facts about the config without starting it; raises ConfigRejected if vLLM would refuse."""
        ...

    def start(self, deployment: Deployment, config: ServeConfig) -> Instance:
        """Start (or attach to) the deployment; raises ConfigRejected on a refused start."""
        ...


__all__ = ["Backend", "Instance"]

"""One vLLM V1 engine (a replica) stepped in virtual time: scheduler, KV pool, step time.

The package, one module per noun: ``engine_core`` (:class:`EngineCore`: the clock, steps
and decode runs, the delivery of tokens; it owns the objects below), ``policy``
(:class:`~tuner.sim.scheduler.policy.Scheduler`: the KV pool, WAITING queue, running
batch and the policy of a step, after ``vllm/v1/core/sched/scheduler.py::schedule``),
``requests`` (the request table; :func:`shared_units`), ``decode_runs`` (many decode steps
at once), ``frontend`` (:class:`~tuner.sim.scheduler.frontend.FrontEnd`, the API server's
queue beside the engine) and ``steps`` (what a step reports: :class:`StepOutput`,
:class:`Advance`). Every public name is imported here.
"""
from __future__ import annotations

from tuner.sim.scheduler.engine_core import EngineCore
from tuner.sim.scheduler.requests import shared_units
from tuner.sim.scheduler.steps import Advance, StepOutput

__all__ = ["shared_units", "StepOutput", "Advance", "EngineCore"]

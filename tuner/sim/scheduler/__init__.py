"""One vLLM V1 engine (a replica) stepped in virtual time: scheduler, KV pool, step time.

The package, one module per noun: ``engine_core`` (:class:`EngineCore`: its requests,
blocks and stepping; :func:`shared_units`), ``policy`` (the scheduling policy of a step,
after ``vllm/v1/core/sched/scheduler.py::schedule``), ``decode_runs`` (many decode steps at
once), ``frontend`` (the API server's queue beside the engine) and ``steps`` (what a step
reports: :class:`StepOutput`, :class:`Advance`). Every public name is imported here.
"""
from __future__ import annotations

from tuner.sim.scheduler.engine_core import EngineCore, shared_units
from tuner.sim.scheduler.steps import Advance, StepOutput

__all__ = ["shared_units", "StepOutput", "Advance", "EngineCore"]

"""An embedded simulator of vLLM: hardware catalog, model shapes, the startup memory
planner, and (in engine/scheduler modules) the V1 scheduler in virtual time."""
from __future__ import annotations

from tuner.sim.hardware import GPU, get_gpu, list_gpus
from tuner.sim.memory import MemoryPlan, plan_memory
from tuner.sim.model import ModelSpec, load_model

__all__ = ["GPU", "MemoryPlan", "ModelSpec", "get_gpu", "list_gpus", "load_model", "plan_memory"]

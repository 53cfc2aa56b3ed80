"""Traffic: read request logs, synthesise workloads, shape the offered load."""
from __future__ import annotations

from tuner.traffic.workload import Request, Workload

__all__ = ["Request", "Workload"]

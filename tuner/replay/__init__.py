"""Replay a workload against running OpenAI-compatible servers (vLLM, ``tuner sim-serve``).

``replay(endpoints, workload, load, ...) -> RunResult`` is the entry point; see
:mod:`tuner.replay.stream` for the measurement definitions.
"""
from __future__ import annotations

from tuner.replay.client import replay, replay_async
from tuner.replay.metrics import MetricsPoller, parse_prometheus
from tuner.replay.prompts import prompt_ids
from tuner.runtime.routing import ROUTERS, Router

__all__ = ["ROUTERS", "MetricsPoller", "Router", "parse_prometheus", "prompt_ids", "replay", "replay_async"]

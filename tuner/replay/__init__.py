"""Replay a workload against running OpenAI-compatible servers (vLLM, ``tuner sim-serve``).

``replay(endpoints, workload, load, ...) -> RunResult`` is the entry point; see
:mod:`tuner.replay.stream` for the measurement definitions.
"""
from __future__ import annotations

from tuner.core.lazy import lazy_exports

#: name -> the module that defines it, read on first use: a module of this package that
#: needs no HTTP client (disruption, the search's referee) does not load aiohttp
_WHERE = {"replay": "client", "replay_async": "client", "MetricsPoller": "metrics", "parse_prometheus": "metrics",
          "prompt_ids": "prompts", "ROUTERS": "tuner.runtime.routing", "Router": "tuner.runtime.routing"}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

__all__ = ["ROUTERS", "MetricsPoller", "Router", "parse_prometheus", "prompt_ids", "replay", "replay_async"]

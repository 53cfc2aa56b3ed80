"""Backends start a deployment with a :class:`~tuner.config.ServeConfig` and run a
load against it. One module each: ``sim`` (embedded simulator), ``vllm`` (real
processes), ``endpoint`` (a server someone else runs). :func:`get_backend` picks one."""
from __future__ import annotations

from tuner.backends.base import Backend, Instance, RunControl

__all__ = ["Backend", "Instance", "RunControl"]

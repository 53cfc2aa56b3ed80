"""Backends start a deployment with a :class:`~tuner.serving.config.ServeConfig` and run a
load against it. One module each: ``sim`` (embedded simulator), ``vllm`` (real
processes), ``endpoint`` (a server someone else runs). :func:`get_backend` picks one.
Each meets the protocol its users declare (:mod:`tuner.search.backend`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError

if TYPE_CHECKING:
    from tuner.backends.endpoint import EndpointBackend
    from tuner.backends.sim import SimBackend
    from tuner.backends.vllm import VllmBackend

BACKENDS = ("sim", "vllm", "endpoint")


def backend_class(name: str) -> type[SimBackend | VllmBackend | EndpointBackend]:
    """The class of backend ``name`` (``sim``, ``vllm`` or ``endpoint``): its constructor's
    parameters say what it can be told (``log_dir``, ``record_itl``, ...)."""
    match name:
        case "sim":
            from tuner.backends.sim import SimBackend as cls
        case "vllm":
            from tuner.backends.vllm import VllmBackend as cls
        case "endpoint":
            from tuner.backends.endpoint import EndpointBackend as cls
        case _:
            raise InputError(f"unknown backend {name!r}", hint=f"use one of {', '.join(BACKENDS)}")
    return cls


def get_backend(name: str, **options: Any) -> SimBackend | VllmBackend | EndpointBackend:
    """``get_backend("sim")``, ``get_backend("vllm", vllm_cmd=..., log_dir=...)``,
    ``get_backend("endpoint", urls=[...])``; options go to the backend's constructor."""
    return backend_class(name)(**options)


__all__ = ["BACKENDS", "backend_class", "get_backend"]

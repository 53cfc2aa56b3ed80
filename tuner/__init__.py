"""tuner: find the vLLM configuration with the most token throughput under a P95
TTFT target, and plan capacity from it."""
from __future__ import annotations

from tuner.config import Deployment, ServeConfig
from tuner.errors import (
    BackendError,
    ConfigRejected,
    InputError,
    NoFeasibleConfig,
    TunerError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "ConfigRejected",
    "Deployment",
    "InputError",
    "NoFeasibleConfig",
    "ServeConfig",
    "TunerError",
    "__version__",
]

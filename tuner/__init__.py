"""tuner: find the vLLM configuration with the most token throughput under a P95
TTFT target, and plan capacity from it.

The API that the ``tuner`` command and notebooks both call (each imported on first use):

* ``tuner.search(space="default", *, deployment=..., workload=..., backend="sim",
  settings=tuner.SearchSettings(budget=40), observer=None, ...)`` — run or resume a
  study (:func:`tuner.search.workflow.search`); returns a ``SearchOutcome``.
* ``tuner.plan(target_ttft_s=None, *, study=..., trial=..., sweep=tuner.Sweep(...),
  figures=tuner.Figures(...), observer=None, ...)`` — how much traffic a study's best
  configuration holds at the target (:func:`tuner.plan.plan_capacity`); returns a
  ``CapacityEstimate``.
* ``tuner.open_study(path_or_name, storage=None)`` — an existing study, to read with
  :mod:`tuner.study.analysis` (:func:`tuner.study.analysis.open_study`).

``tuner.search`` and ``tuner.plan`` are also the packages that implement them: calling the
package calls its function (each package says how). Progress goes to an optional ``observer``
(:class:`tuner.runtime.progress.Observer`); ``None`` shows nothing.
"""
from __future__ import annotations

import importlib
from typing import Any

from tuner.core.errors import (
    BackendError,
    ConfigRejected,
    InputError,
    NoFeasibleConfig,
    TunerError,
)
from tuner.serving.config import Deployment, ServeConfig

__version__ = "0.1.0"

#: Lazily imported names of the API: name -> (module, attribute).
_LAZY = {
    "search": ("tuner.search", None),
    "plan": ("tuner.plan", None),
    "open_study": ("tuner.study.analysis", "open_study"),
    "SearchSettings": ("tuner.search.driver", "SearchSettings"),
    "Sweep": ("tuner.plan", "Sweep"),
    "Figures": ("tuner.plan", "Figures"),
    "Observer": ("tuner.runtime.progress", "Observer"),
    "TrialRecord": ("tuner.study.record", "TrialRecord"),
    "StudyRecord": ("tuner.study.record", "StudyRecord"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    found = importlib.import_module(module)
    return found if attribute is None else getattr(found, attribute)


__all__ = [
    "BackendError",
    "ConfigRejected",
    "Deployment",
    "Figures",
    "InputError",
    "NoFeasibleConfig",
    "Observer",
    "SearchSettings",
    "ServeConfig",
    "StudyRecord",
    "Sweep",
    "TrialRecord",
    "TunerError",
    "__version__",
    "open_study",
    "plan",
    "search",
]

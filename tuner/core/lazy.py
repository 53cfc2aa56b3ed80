"""A package's names re-exported from its modules, each module imported on first use
(PEP 562's module ``__getattr__``): ``from tuner.search import SearchSettings`` reads the
module that defines it, and importing the package itself stays cheap (``import tuner``
loads the packages of the verbs without what they run)."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` whose names ``where`` maps to the
    submodule that defines each (relative to the package, or a whole ``tuner.`` name)."""
    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = where[name]
        return getattr(importlib.import_module(module if module.startswith("tuner.") else f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__


__all__ = ["lazy_exports"]

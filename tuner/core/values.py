"""How a value given by the user is checked and shown in a message: the helpers every
validating module shares (configs, search spaces, YAML files, durations, catalogs)."""
from __future__ import annotations

import reprlib
from typing import Any

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 3, 60, 60


def shown(value: Any) -> str:
    """``repr(value)`` cut to a readable length (a YAML alias can make a value enormous)."""
    return _SHORT.repr(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


__all__ = ["is_int", "is_number", "shown"]

"""How a value given by the user is checked and shown in a message: the helpers every
validating module shares (configs, search spaces, YAML files, durations, catalogs)."""
from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Mapping
from typing import Any, TypeVar

from tuner.core.errors import InputError

T = TypeVar("T")

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 3, 60, 60


def shown(value: Any) -> str:
    """``repr(value)`` cut to a readable length (a YAML alias can make a value enormous)."""
    return _SHORT.repr(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def replaced(base: T, value: T | Mapping[str, Any] | None, argument: str) -> T:
    """``value`` where it is an object of ``base``'s class, ``base`` with the fields a mapping
    ``value`` changes, or ``base`` for ``None``: how the API takes ``deployment=`` and
    ``workload=`` (an object, or a dict of changes as a convenience). Anything else, or a
    key that is not a field, is one :class:`~tuner.core.errors.InputError` naming ``argument``."""

    kind = type(base)
    if value is None:
        return base
    if isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise InputError(f"{argument} must be a {kind.__name__} or a dict of its fields, got {type(value).__name__}",
                         argument=argument, hint=f"e.g. {argument}=tuner.{kind.__name__}(...)")
    fields = [f.name for f in dataclasses.fields(kind) if f.init]  # type: ignore[arg-type]
    unknown = [k for k in value if k not in fields]
    if unknown:
        raise InputError(f"{argument} has no field {shown(unknown[0])}: {kind.__name__}'s are {', '.join(fields)}",
                         argument=argument)
    return dataclasses.replace(base, **value)  # type: ignore[type-var]


__all__ = ["is_int", "is_number", "replaced", "shown"]

"""A value computed once per live object, for objects that cannot be hashed or carry it.

Optuna hands out the same FrozenTrial for a finished trial look after look, and a finished
trial cannot change (Optuna refuses to update one); but a FrozenTrial's hash covers its
dicts (it cannot key a dict) and its fields are its equality (an attribute set on it would
change that). So :func:`once_per_object` keys by the object's id, beside a weak reference
that drops the entry when the object goes: an id reused by a later object never finds it.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_MEMO: dict[int, tuple[weakref.ref, Any]] = {}


def once_per_object(obj: object, make: Callable[[], T]) -> T:
    """``make()``, computed once while ``obj`` lives (each time for an object without weak
    references). Only for objects whose content no longer changes."""
    key = id(obj)
    hit = _MEMO.get(key)
    if hit is not None and hit[0]() is obj:
        return hit[1]
    value = make()
    try:
        ref = weakref.ref(obj, lambda _ref, key=key: _MEMO.pop(key, None))
    except TypeError:
        return value
    _MEMO[key] = (ref, value)
    return value


__all__ = ["once_per_object"]

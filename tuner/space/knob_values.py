"""A knob's value as a space file or ``--set`` writes it: :data:`KNOB_TYPES` (the knobs a space may
vary, with their Python type), :func:`pin_value`, and the number readers both share."""
from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any

from tuner.core.errors import InputError
from tuner.core.knobs import KNOBS, knob
from tuner.core.values import is_int, is_number, shown
from tuner.serving.config import ServeConfig

#: Knobs a space may vary, with their Python type (the rows of :data:`tuner.core.knobs.KNOBS`).
KNOB_TYPES: dict[str, type] = {k.name: k.type for k in KNOBS}

#: Knobs whose ``null`` means "vLLM's default" (ServeConfig fields that default to None).
DEFAULT_NONE = {f.name for f in fields(ServeConfig) if f.default is None}


def knob_problem(name: str, value: Any) -> tuple[str, str | None] | None:
    """What is wrong with ``value`` as knob ``name``'s (not its type, or not one of its choices:
    a KV cache dtype vLLM does not have) as ``(message, hint)``; None when nothing is. A space file's value
    (:func:`~tuner.space.parameters._typed`) and a pinned one (:func:`pin_value`) are checked by it alike."""
    typ = KNOB_TYPES[name]
    ok = (
        (typ is bool and isinstance(value, bool))
        or (typ is int and is_int(value))
        or (typ is float and is_number(value))
        or (typ is str and isinstance(value, str))
    )
    if not ok:
        return f"{name} takes {typ.__name__} values, got {shown(value)}", None
    choices = knob(name).choices
    if choices and value not in choices:
        return f"{name} {shown(value)} is unknown", f"use one of {', '.join(choices)}"
    return None


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def pin_value(name: str, value: Any, said: str) -> Any:
    """``value`` (typed, or text from ``--set``) as knob ``name`` takes it, checked as a
    space file's value is; InputError naming ``said`` (what the user wrote) otherwise."""
    typ = KNOB_TYPES[name]
    if isinstance(value, str) and typ is not str:
        text = value.strip().lower()
        try:
            if typ is bool:
                if text not in _TRUE + _FALSE:
                    raise ValueError(text)
                value = text in _TRUE
            else:
                value = typ(float(text)) if typ is int and float(text).is_integer() else typ(text)
        except ValueError:
            raise InputError(f"{said}: {name} takes {typ.__name__} values, got {shown(value)}",
                             hint="e.g. --set max_num_seqs=256, --set enforce_eager=true") from None
    problem = knob_problem(name, value)
    if problem is not None:
        raise InputError(f"{said}: {problem[0]}", hint=problem[1])
    value = float(value) if typ is float else typ(value)
    try:
        ServeConfig(**{name: value})
    except InputError as err:
        raise InputError(f"{said}: {err.message}", hint=err.hint) from err
    return value


_EXPONENT = re.compile(r"\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]{1,4}\s*")


def numeric(value: Any) -> Any:
    """``"1e6"`` (text to PyYAML, which wants ``1.0e+6``; a number in YAML 1.2) as a float;
    anything else unchanged."""
    if isinstance(value, str) and _EXPONENT.fullmatch(value):
        return as_float(float(value))
    return value


def whole(value: Any) -> Any:
    """An integral float (``1.0e+3``) as an int; anything else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def own_message(message: str, name: str) -> str:
    """``message`` without a leading ``name`` (the key in front of it says it already)."""
    return message[len(name) + 1:] if message.startswith(f"{name} ") else message


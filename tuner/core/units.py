"""Units a person types: durations (``5s``, ``500ms``, ``2m``)."""
from __future__ import annotations

import math
import re

from tuner.core.errors import InputError
from tuner.core.values import shown


def parse_seconds(value: str | float | int, *, what: str = "time") -> float:
    """``"5s"``, ``"500ms"``, ``"2m"``, ``"24h"``, ``"1d"`` or a bare number of seconds → seconds (> 0)."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be a duration such as 5s or 500ms, got {value!r}", argument=what)
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?\d+)?)\s*(ms|s|sec|m|min|h|d)?\s*", str(value).lower())
        if not m:
            raise InputError(
                f"cannot read {what} {shown(value)}", hint="write a duration such as 5s, 500ms or 5", argument=what
            )
        units = {"ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
        seconds = float(m.group(1)) * units.get(m.group(2) or "s", 1.0)
    if not seconds > 0 or not math.isfinite(seconds):
        raise InputError(f"{what} must be > 0 and finite, got {shown(value)}", argument=what)
    return seconds


__all__ = ["parse_seconds"]

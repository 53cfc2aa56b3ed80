"""One rule for what tuner writes as JSON (trial attrs, plans, measurement files)."""
from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any, *, digits: int | None = None) -> Any:
    """A JSON-safe copy of ``value``: dicts (keys as strings), lists, tuples and numpy
    arrays recursed; numpy scalars as Python numbers; NaN and infinities as ``None``
    (JSON has neither); floats rounded to ``digits`` decimals when given; anything else
    that is not a JSON scalar as its ``str``."""
    if isinstance(value, dict):
        return {str(k): json_safe(v, digits=digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, digits=digits) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) and getattr(value, "ndim", 0):
        return [json_safe(v, digits=digits) for v in value.tolist()]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, digits) if digits is not None else value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


__all__ = ["json_safe"]

"""vLLM versions as tuner reads them: one parser for the planner, the launcher, the
calibration profiles and sim-serve (three used to disagree: "0.26" found no profile
for 0.26.0 while the planner read it as 0.26.0)."""
from __future__ import annotations

import re

from tuner.core.errors import InputError

_VERSION = re.compile(r"\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.26.0"`` -> ``(0, 26, 0)``, ``"0.26"`` -> ``(0, 26, 0)``; suffixes such as
    ``rc2``, ``.post1`` or ``+cu128`` are ignored (``"0.11.0rc2+cu128"`` -> ``(0, 11, 0)``)."""
    match = _VERSION.match(str(text))
    if not match:
        raise InputError(f"cannot read vLLM version {str(text)[:40]!r}", hint="write it like 0.6.3 or 0.26.0")
    major, minor, patch = (int(g or 0) for g in match.groups())
    return major, minor, patch


def same_version(a: str, b: str) -> bool:
    """Whether two version strings name the same release (``"0.26"`` is ``"0.26.0"``);
    False when either cannot be read."""
    try:
        return parse_version(a) == parse_version(b)
    except InputError:
        return False


__all__ = ["parse_version", "same_version"]

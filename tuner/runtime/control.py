"""What a caller sees of a run while it goes, and how it stops it: the vocabulary the
simulator's engine, the HTTP replayer, the backends and the search share.

Every run (simulated or replayed) hands a :class:`RunControl` to the caller's ``stop``
hook after each request ends; ``stop(control) -> True`` ends the run early (the search
does so once P95 TTFT is lost beyond recovery, or too many requests failed).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class RunControl:
    """Live view of a run, handed to the caller's ``stop`` hook after each request ends.

    Counts are of requests; times are seconds since the run began (simulated seconds on
    the simulator)."""

    sent: int = 0
    finished: int = 0
    total: int = 0
    elapsed_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)


StopHook = Callable[[RunControl], bool]

__all__ = ["RunControl", "StopHook"]

"""Which replica gets the next request: ``round_robin`` or ``least_outstanding``.

A router only sees its own view (requests it has in flight per replica);
``least_outstanding`` is what a proxy in front of several vLLM replicas usually does.
The HTTP replayer routes between endpoints with it, the simulator between its engines.
"""
from __future__ import annotations

from tuner.core.errors import InputError

ROUTERS = ("round_robin", "least_outstanding")


class Router:
    """Picks a replica index for each request; ``done(i)`` when that request ends."""

    def __init__(self, replicas: int, policy: str = "round_robin") -> None:
        if policy not in ROUTERS:
            raise InputError(f"unknown router {policy!r}", hint=f"use one of {', '.join(ROUTERS)}")
        if replicas < 1:
            raise InputError("a router needs at least one replica (an endpoint URL)")
        self.policy = policy
        self.outstanding = [0] * replicas
        self._next = 0

    def pick(self) -> int:
        if self.policy == "round_robin":
            i = self._next
            self._next = (i + 1) % len(self.outstanding)
        else:
            # Fewest in flight; ties go to the lowest index (deterministic).
            i = min(range(len(self.outstanding)), key=self.outstanding.__getitem__)
        self.outstanding[i] += 1
        return i

    def done(self, i: int) -> None:
        self.outstanding[i] -= 1

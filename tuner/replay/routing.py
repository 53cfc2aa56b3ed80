"""Which replica gets the next request: ``round_robin`` or ``least_outstanding``.

A router only sees the client's own view (requests it has in flight per endpoint);
``least_outstanding`` is what a proxy in front of several vLLM replicas usually does.
"""
from __future__ import annotations

from tuner.errors import InputError

ROUTERS = ("round_robin", "least_outstanding")


class Router:
    """Picks an endpoint index for each request; ``done(i)`` when that request ends."""

    def __init__(self, n_endpoints: int, policy: str = "round_robin") -> None:
        if policy not in ROUTERS:
            raise InputError(f"unknown router {policy!r}", hint=f"use one of {', '.join(ROUTERS)}")
        if n_endpoints < 1:
            raise InputError("replay needs at least one endpoint URL")
        self.policy = policy
        self.outstanding = [0] * n_endpoints
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

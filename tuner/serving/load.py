"""How a workload is offered to a server: tiny strategy objects.

* :class:`TraceReplay` — logged arrival times, compressed by ``multiplier``
  (2.0 replays the log twice as fast).
* :class:`Poisson` — arrivals at ``rate`` requests/s; ``burstiness`` != 1 gives gamma
  inter-arrivals with that shape (vLLM bench's definition: 1.0 is Poisson, lower is burstier).
* :class:`Concurrency` — closed loop: ``users`` requests in flight at all times, each
  user sending the next request (in workload order) when its previous one ends.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.core.errors import InputError


@dataclass(frozen=True, slots=True)
class TraceReplay:
    multiplier: float = 1.0

    def __post_init__(self) -> None:
        if not self.multiplier > 0:
            raise InputError(f"rate multiplier must be > 0, got {self.multiplier}")

    @property
    def label(self) -> str:
        return f"trace x{self.multiplier:g}"


@dataclass(frozen=True, slots=True)
class Poisson:
    rate: float
    burstiness: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise InputError(f"request rate must be > 0 req/s, got {self.rate}")
        if not self.burstiness > 0:
            raise InputError(f"burstiness must be > 0, got {self.burstiness}")

    @property
    def label(self) -> str:
        return f"{self.rate:g} req/s"


@dataclass(frozen=True, slots=True)
class Concurrency:
    users: int

    def __post_init__(self) -> None:
        if not isinstance(self.users, (int, np.integer)) or self.users < 1:
            raise InputError(f"concurrency must be a positive integer, got {self.users!r}")

    @property
    def label(self) -> str:
        return f"{self.users} users"


Load = TraceReplay | Poisson | Concurrency


def arrival_times(load: Load, logged_arrival_s: np.ndarray) -> np.ndarray | None:
    """Send times (seconds from start) for an open-loop load; ``None`` for closed loop."""
    n = len(logged_arrival_s)
    match load:
        case TraceReplay(multiplier=m):
            base = logged_arrival_s - (logged_arrival_s[0] if n else 0.0)
            return base / m
        case Poisson(rate=rate, burstiness=b, seed=seed):
            rng = np.random.default_rng(seed)
            # gamma(shape=b, scale=1/(rate*b)) has mean 1/rate; b == 1 is exponential.
            gaps = rng.gamma(shape=b, scale=1.0 / (rate * b), size=n)
            if n:
                gaps[0] = 0.0
            return np.cumsum(gaps)
        case Concurrency():
            return None
    raise InputError(f"unknown load {load!r}")


def parse_load(text: str) -> Load:
    """Parse a load written on the command line: ``c=20`` / ``20users`` (closed loop),
    ``rate=5`` / ``5/s`` (Poisson), ``x2`` (trace replay twice as fast); a load's own
    :attr:`label` (``20 users``, ``5 req/s``, ``trace x2``) reads back too."""
    s = text.strip().lower().replace(" ", "")
    try:
        if s.startswith("c=") or s.endswith("users"):
            return Concurrency(int(s.removeprefix("c=").removesuffix("users")))
        if s.startswith("rate=") or s.endswith("/s"):
            return Poisson(float(s.removeprefix("rate=").removesuffix("/s").removesuffix("req")))
        if s.startswith("x") or s.startswith("tracex"):
            return TraceReplay(float(s.removeprefix("trace")[1:]))
    except ValueError:
        pass
    raise InputError(
        f"cannot read load {text!r}",
        hint="write c=20 for 20 concurrent users, 5/s for 5 requests/s, x2 for the trace twice as fast",
    )

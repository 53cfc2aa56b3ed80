"""The cheapest deployment that meets a demand within the inventory: an integer program over
engines of each kind (``scipy.optimize.milp``).

Variables: ``x_k``, the engines of kind ``k`` (each ``tp_k`` GPUs), whole numbers from 0 to what
the inventory holds. Minimise ``sum(cost_k x_k)`` subject to ``sum(capacity_k x_k) >= need``
(the demand with its headroom). Among deployments of equal cost the one with the fewest engines
wins (a term a millionth of the cheapest engine's cost each).

:func:`options` gives the cheapest deployment and its runner-ups: the cheapest without each kind
the best one uses, and the cheapest of each kind alone, best first. Each carries its cost range
under the kinds' bands (:attr:`Mix.cost_range`): the same kinds re-solved with every capacity at
the low end of its band and at the high end. Two options whose ranges overlap are a tie.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tuner.core.errors import InputError


@dataclass(frozen=True, slots=True)
class Unit:
    """One engine of a kind: what it holds (per minute, conversations or requests), what it
    costs an hour, how many the inventory has (None: unlimited) and its capacity's band."""

    label: str
    capacity: float
    cost: float
    available: int | None = None
    band: float = 0.0
    gpus: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity) and self.capacity > 0):
            raise InputError(f"{self.label}: an engine's capacity must be > 0, got {self.capacity}")
        if not (math.isfinite(self.cost) and self.cost >= 0):
            raise InputError(f"{self.label}: an engine's cost must be >= 0, got {self.cost}")
        if not 0 <= self.band < 1:
            raise InputError(f"{self.label}: a band must be in [0, 1), got {self.band}")


@dataclass(frozen=True, slots=True)
class Mix:
    """A deployment: engines per kind label, its cost an hour and its capacity per minute;
    ``cost_range`` (low, high) with every capacity at the high and at the low end of its band
    (high ``inf`` when the inventory cannot meet the demand then)."""

    engines: dict[str, int]
    cost_per_hour: float
    capacity: float
    cost_range: tuple[float, float] = (math.nan, math.nan)
    why: str = ""
    gpus: dict[str, int] = field(default_factory=dict)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k, n in self.engines.items() if n)

    def text(self) -> str:
        return " + ".join(f"{n} x {k}" for k, n in self.engines.items() if n) or "nothing"

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.cost_range
        return {"engines": dict(self.engines), "gpus": dict(self.gpus), "cost_per_hour": self.cost_per_hour,
                "capacity": self.capacity, "cost_range": [lo, None if math.isinf(hi) else hi], "why": self.why}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Mix:
        lo, hi = data.get("cost_range") or (math.nan, math.nan)
        return cls(engines=dict(data["engines"]), cost_per_hour=data["cost_per_hour"], capacity=data["capacity"],
                   cost_range=(lo, math.inf if hi is None else hi), why=data.get("why", ""),
                   gpus=dict(data.get("gpus") or {}))


def cheapest(units: Sequence[Unit], need: float, *, scale: Sequence[float] | None = None) -> Mix | None:
    """The cheapest mix of ``units`` holding ``need`` per minute (capacities times ``scale``
    when given), or None when the inventory cannot."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    if not units:
        return None
    if need <= 0:
        return Mix({u.label: 0 for u in units}, 0.0, 0.0)
    cap = np.array([u.capacity for u in units], dtype=float) * (np.asarray(scale, dtype=float) if scale is not None
                                                                else 1.0)
    cost = np.array([u.cost for u in units], dtype=float)
    tiny = 1e-6 * max(float(cost[cost > 0].min()) if (cost > 0).any() else 1.0, 1e-9)
    upper = np.array([np.inf if u.available is None else u.available for u in units], dtype=float)
    res = milp(cost + tiny, constraints=LinearConstraint(cap[None, :], lb=need, ub=np.inf),
               integrality=np.ones(len(units)), bounds=Bounds(np.zeros(len(units)), upper))
    if res.status != 0 or res.x is None:
        return None
    x = np.round(res.x).astype(int)
    return Mix({u.label: int(n) for u, n in zip(units, x)}, float(cost @ x), float(cap @ x),
               gpus={u.label: int(n) * u.gpus for u, n in zip(units, x)})


def with_range(mix: Mix, units: Sequence[Unit], need: float) -> Mix:
    """``mix`` with its cost range: the same kinds re-solved at the optimistic and the
    pessimistic end of every band."""
    same = [u for u in units if mix.engines.get(u.label)]
    hi = cheapest(same, need, scale=[1 - u.band for u in same])
    lo = cheapest(same, need, scale=[1 + u.band for u in same])
    return replace(mix, cost_range=(lo.cost_per_hour if lo else math.nan, hi.cost_per_hour if hi else math.inf))


def options(units: Sequence[Unit], need: float, *, top: int = 3) -> list[Mix]:
    """The cheapest mix first, then the runner-ups: the cheapest without each kind it uses,
    and each kind alone; distinct, cheapest first, ``top`` of them."""
    best = cheapest(units, need)
    if best is None:
        return []
    found = [replace(best, why="cheapest")]
    for kind in best.kinds:
        alt = cheapest([u for u in units if u.label != kind], need)
        if alt is not None:
            found.append(replace(alt, why=f"without {kind}"))
    for u in units:
        alone = cheapest([u], need)
        if alone is not None:
            found.append(replace(alone, why=f"{u.label} alone"))
    distinct: dict[tuple[tuple[str, int], ...], Mix] = {}
    for m in found:  # every mix names every kind, in the inventory's order
        m = replace(m, engines={u.label: m.engines.get(u.label, 0) for u in units},
                    gpus={u.label: m.gpus.get(u.label, 0) for u in units})
        key = tuple(sorted((k, n) for k, n in m.engines.items() if n))
        distinct.setdefault(key, m)
    ranked = sorted(distinct.values(), key=lambda m: (m.cost_per_hour, sum(m.engines.values())))
    return [with_range(m, units, need) for m in ranked[:top]]


def most_capacity(units: Sequence[Unit]) -> float:
    """What the whole inventory holds per minute (inf when a kind is unlimited)."""
    return sum(math.inf if u.available is None else u.available * u.capacity for u in units)


__all__ = ["Mix", "Unit", "cheapest", "most_capacity", "options", "with_range"]

"""The fleet plan's figure: cost an hour against demand, one step line per kind alone (up to
what its inventory holds), the cheapest deployment at each demand (the integer program solved
again there), and the chosen deployment marked at the plan's demand."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tuner.core.files import write_atomic
from tuner.fleet.record import units_of
from tuner.fleet.solver import cheapest
from tuner.plots import png_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tuner.fleet.record import FleetPlan


def fleet_figure(plan: FleetPlan, points: int = 60) -> Figure:
    """Cost an hour (y) against demand a minute (x) per kind and for the cheapest mix."""
    from matplotlib.figure import Figure

    units = units_of(plan.kinds, plan.demand_unit)
    top = max(plan.demand_per_min * 2.0, 1.0)
    demand = np.linspace(top / points, top, points)
    fig = Figure(figsize=(8, 4.8), dpi=100)
    ax = fig.add_subplot()
    for u in units:
        cost = []
        for d in demand:
            n = math.ceil(d * (1 + plan.headroom) / u.capacity * (1 - 1e-12))
            cost.append(n * u.cost if u.available is None or n <= u.available else math.nan)
        ax.step(demand, cost, where="post", label=f"{u.label} alone ({u.capacity:,.0f}/min an engine)")
    mix = [cheapest(units, d * (1 + plan.headroom)) for d in demand]
    ax.plot(demand, [m.cost_per_hour if m else math.nan for m in mix], "k--", linewidth=1.5,
            label="cheapest within the inventory")
    best = plan.best
    if best is not None:
        lo, hi = best.cost_range
        ax.plot([plan.demand_per_min], [best.cost_per_hour], "r*", markersize=16, label=f"chosen: {best.text()}")
        if math.isfinite(lo) and math.isfinite(hi):
            ax.errorbar([plan.demand_per_min], [best.cost_per_hour],
                        yerr=[[best.cost_per_hour - lo], [hi - best.cost_per_hour]], color="r", capsize=4)
    ax.axvline(plan.demand_per_min, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel(f"demand ({plan.demand_unit}/min, +{plan.headroom:.0%} headroom provisioned)")
    ax.set_ylabel("cost per hour")
    ax.set_title(f"fleet {plan.fleet.get('name')}: {plan.fleet.get('model')}, {', '.join(plan.slos)}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def write_figure(plan: FleetPlan, path: str | Path) -> Path:
    """The figure as a PNG at ``path``."""

    p = Path(path)
    write_atomic(p, png_bytes(fleet_figure(plan)))
    return p


__all__ = ["fleet_figure", "write_figure"]

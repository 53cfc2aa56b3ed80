"""Fleet planning: across the GPU kinds a team has or can rent, which ones, how many, with which
vLLM flags, at what cost, and how sure each figure is (``tuner plan --fleet FILE``).

:func:`plan_fleet` reads a fleet file (:mod:`~tuner.fleet.inventory`), and for each kind states
what is true before any number (:mod:`~tuner.fleet.truth`: which vLLM lines run there, what vLLM
refuses in its own words, the physical ceilings) and how sure its figures are
(:mod:`~tuner.fleet.bands`), searches its flags and sweeps its capacity on the simulator
(:mod:`~tuner.fleet.kinds`), then solves for the cheapest deployment within the inventory, one
kind or a mix, with its runner-ups (:mod:`~tuner.fleet.solver`, an integer program). What it
found is one record (:mod:`~tuner.fleet.record`: :class:`FleetPlan`, written as
``fleet-plan.json``, read back with :func:`load_fleet`) and one figure (:mod:`~tuner.fleet.figure`).
Each module is imported by its own path; the names below are the public ones.
"""
from __future__ import annotations

from typing import Any

_NAMES = {
    "plan_fleet": "tuner.fleet.planner",
    "read_fleet": "tuner.fleet.inventory",
    "Fleet": "tuner.fleet.inventory",
    "Kind": "tuner.fleet.inventory",
    "FleetPlan": "tuner.fleet.record",
    "KindPlan": "tuner.fleet.record",
    "load_fleet": "tuner.fleet.record",
    "Band": "tuner.fleet.bands",
    "band_for": "tuner.fleet.bands",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _NAMES:
        raise AttributeError(f"module 'tuner.fleet' has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name]), name)


__all__ = sorted(_NAMES)

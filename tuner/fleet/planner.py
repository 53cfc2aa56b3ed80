"""The fleet plan (:func:`plan_fleet`): every kind planned (:func:`tuner.fleet.kinds.plan_kind`),
then the cheapest deployment meeting the demand within the inventory and its runner-ups
(:mod:`tuner.fleet.solver`), ties under the bands, and the record and figure written."""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.fleet.bands import HINT, overlap
from tuner.fleet.figure import write_figure
from tuner.fleet.inventory import Fleet, read_fleet
from tuner.fleet.kinds import Traffic, plan_kind
from tuner.fleet.record import FleetPlan, KindPlan, units_of, write_fleet
from tuner.fleet.solver import most_capacity, options
from tuner.runtime.progress import observer_or_headless
from tuner.serving.demand import parse_demand
from tuner.serving.slo import SloSet, split_slos
from tuner.study.storage import STUDIES_DIR

if TYPE_CHECKING:
    from tuner.runtime.progress import Observer
    from tuner.traffic.workload import Workload


def default_folder(fleet: Fleet) -> Path:
    """Where a fleet's studies, record and figure go: ``studies/fleet-<name>/``."""

    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in fleet.name)
    return Path(STUDIES_DIR) / f"fleet-{safe}"


def plan_fleet(fleet: Fleet | str | Path, demand: str | float, *, slos: Sequence[str] = ("p95:ttft<=5s",),
               tokens_per_conversation: float | None = None, headroom: float = 0.2, trace: Workload | None = None,
               requests: int | None = None, pins: Mapping[str, Any] | None = None, seed: int = 0,
               budget: int | None = None, model: str | None = None, folder: str | Path | None = None,
               storage: str | None = None, files: bool = True, observer: Observer | None = None) -> FleetPlan:
    """Plan ``fleet`` (a :class:`Fleet`, a fleet file or a shipped fleet's name) for
    ``demand`` (``"3000/min"`` conversations, ``"20req/s"``) at ``slos`` (``p95:ttft<=5s``
    first or alone: the P95 TTFT target; others as ``tuner plan --slo``). Each kind's flags are
    searched on the simulator (the fleet's space, ``budget`` trials, default the fleet's),
    its capacity swept, and the cheapest deployment within the inventory solved for, with its
    runner-ups. ``trace`` replaces the built-in request mix; ``pins`` fix knobs on every kind;
    ``model`` replaces the fleet's. The kinds' studies go to ``storage`` (default
    ``sqlite:///<folder>/studies.db``), the record and figure to ``folder`` (default
    ``studies/fleet-<name>/``) unless ``files`` is False. ``observer`` sees each kind's search
    and sweep (None: headless)."""

    t0, c0 = time.perf_counter(), time.process_time()
    fl = fleet if isinstance(fleet, Fleet) else read_fleet(fleet)
    if model:
        fl = dataclasses.replace(fl, model=model)
    ttft, others = split_slos(list(slos))
    if ttft is None:
        raise InputError("a fleet plan needs a P95 TTFT target", hint="add --slo p95:ttft<=5s (or --target-ttft 5s)")
    texts = SloSet.of((f"p95:ttft<={ttft:g}s",) + tuple(others)).texts
    wanted = parse_demand(demand)
    traffic = Traffic(slos=tuple(texts), demand=wanted, headroom=headroom, tokens_per_conversation=tokens_per_conversation,  # noqa: E501
                      trace=trace, requests=requests, pins=dict(pins or {}), seed=seed)
    where = Path(folder) if folder is not None else default_folder(fl)
    url = storage or f"sqlite:///{where / 'studies.db'}"
    if storage is None:
        where.mkdir(parents=True, exist_ok=True)
    obs = observer_or_headless(observer)
    kinds = []
    for n, kind in enumerate(fl.kinds, 1):
        obs.on_phase(f"kind {n}/{len(fl.kinds)}: {kind.label}")
        kinds.append(plan_kind(fl, kind, traffic, storage=url, observer=obs, budget=budget))
    plan = solve(fl, kinds, traffic)
    plan = dataclasses.replace(plan, cpu_s=time.process_time() - c0, wall_s=time.perf_counter() - t0,
                               folder=str(where) if files else None, storage=url,
                               created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    if files:
        write_fleet(plan, where)
        write_figure(plan, where / "fleet-plan.png")
    return plan


def solve(fleet: Fleet, kinds: Sequence[KindPlan], traffic: Traffic) -> FleetPlan:
    """The options for the kinds planned, the ties under the bands and the calibrate hint."""
    unit = traffic.demand.unit
    need = traffic.demand.per_min * (1.0 + traffic.headroom)
    units = units_of(kinds, unit)
    found = options(units, need)
    ties = tuple(i for i, m in enumerate(found[1:], 1) if overlap(found[0].cost_range, m.cost_range))
    hint = None
    if ties:
        deciding = {k for i in (0, *ties) for k in found[i].kinds}
        loose = sorted({k.kind["gpu"] for k in kinds if k.label in deciding and not k.band.calibrated})
        if loose:
            hint = f"{HINT}: {', '.join(loose)}"
    most = most_capacity(units)
    notes = []
    if not found:
        notes.append(f"no deployment within the inventory holds {need:,.0f} {unit}/min (the demand with "
                     f"{traffic.headroom:.0%} headroom): everything it has holds {most:,.0f}/min"
                     if units else "no kind serves the model at these SLOs")
    basis = next((k.capacity for k in kinds if k.capacity), None) or {}
    conversation = (f"{basis['tokens_per_conversation']:,.0f} tokens" if basis.get("tokens_per_conversation")
                    else f"{basis.get('requests_per_conversation') or 1:.3g} requests")
    if basis and traffic.tokens_per_conversation is None and basis.get("tokens_per_conversation"):
        conversation += " (a request of the workload's mean; give --tokens-per-conversation)"
    return FleetPlan(fleet=fleet.to_dict(), slos=traffic.slos, demand_per_min=traffic.demand.per_min, demand_unit=unit,
                     headroom=traffic.headroom, need_per_min=need, kinds=tuple(kinds), options=tuple(found),
                     ties=ties, calibrate_hint=hint, most_per_min=most, conversation=conversation,
                     notes=tuple(notes))


def alone(kind: KindPlan, need: float, unit: str) -> int | None:
    """Engines of this kind alone for ``need`` a minute (None: it serves nothing)."""
    per = kind.per_min(unit)
    return None if per <= 0 else max(1, math.ceil(need / per * (1 - 1e-12)))


__all__ = ["alone", "default_folder", "plan_fleet", "solve"]

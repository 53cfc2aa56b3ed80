"""What a fleet plan found, as one typed record with a schema version: per kind a
:class:`KindPlan`, for the fleet a :class:`FleetPlan`; written as JSON beside the kinds' studies
(:func:`write_fleet`) and read back by notebooks and the report (:func:`load_fleet`)."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError
from tuner.core.files import write_atomic
from tuner.core.jsonsafe import json_safe
from tuner.fleet.bands import Band
from tuner.fleet.solver import Mix, Unit
from tuner.fleet.truth import Ceiling, LineSupport, Refusal

SCHEMA_VERSION = 1
RECORD = "fleet-plan.json"


@dataclass(frozen=True, slots=True)
class KindPlan:
    """One kind: its facts and vLLM lines, refusals in vLLM's words (and what it serves instead),
    its band; when it serves the model: the chosen flags and layout (``config``, ``tp``), one
    engine's capacity (a :class:`~tuner.serving.capacity.CapacityEstimate` as a dict), the
    physical ceilings beside the prediction, the search study, the CPU seconds per step."""

    label: str
    kind: dict[str, Any]
    facts: dict[str, Any]
    lines: tuple[LineSupport, ...]
    band: Band
    refusals: tuple[Refusal, ...] = ()
    reason: str | None = None
    instead: str | None = None
    config: dict[str, Any] | None = None
    tp: int | None = None
    capacity: dict[str, Any] | None = None
    ceiling: Ceiling | None = None
    decode_one_user: float | None = None
    study: str | None = None
    trials: int = 0
    command: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return self.capacity is not None

    @property
    def gpu_hour_cost(self) -> float:
        return float(self.kind["gpu_hour_cost"])

    def per_min(self, unit: str = "conversations") -> float:
        """What one engine holds a minute: conversations (as the plan counts them) or requests."""
        if self.capacity is None:
            return 0.0
        if unit == "requests":
            return float(self.capacity["requests_per_s"]) * 60.0
        return float(self.capacity["conversations_per_min"])

    @property
    def engine_cost(self) -> float:
        """One engine's cost an hour (its GPUs times the GPU-hour price)."""
        return self.gpu_hour_cost * (self.tp or 1)

    @property
    def cost_per_million_tokens(self) -> float | None:
        if self.capacity is None or not self.capacity.get("tokens_per_s"):
            return None
        return self.engine_cost / (float(self.capacity["tokens_per_s"]) * 3600) * 1e6

    @property
    def engines_available(self) -> int | None:
        count = self.kind.get("count")
        return None if count is None else int(count) // (self.tp or 1)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["lines"] = [dataclasses.asdict(x) for x in self.lines]
        out["refusals"] = [dataclasses.asdict(x) for x in self.refusals]
        out["band"] = self.band.to_dict()
        out["ceiling"] = None if self.ceiling is None else dataclasses.asdict(self.ceiling)
        out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KindPlan:
        kw = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kw["lines"] = tuple(LineSupport(**x) for x in kw.get("lines", ()))
        kw["refusals"] = tuple(Refusal(**x) for x in kw.get("refusals", ()))
        kw["band"] = Band.from_dict(kw["band"])
        kw["ceiling"] = None if kw.get("ceiling") is None else Ceiling(**kw["ceiling"])
        kw["notes"] = tuple(kw.get("notes", ()))
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """A fleet plan: the fleet, the traffic (SLOs, demand, headroom, how a conversation is
    counted), every kind planned, the options (the cheapest first, each with its cost range
    under the bands), the runner-ups it ties with, and the calibrate hint when the bands decide."""

    fleet: dict[str, Any]
    slos: tuple[str, ...]
    demand_per_min: float
    demand_unit: str
    headroom: float
    need_per_min: float
    kinds: tuple[KindPlan, ...]
    options: tuple[Mix, ...] = ()
    ties: tuple[int, ...] = ()
    calibrate_hint: str | None = None
    most_per_min: float = math.nan
    conversation: str = ""
    cpu_s: float = math.nan
    wall_s: float = math.nan
    folder: str | None = None
    storage: str | None = None
    created: str = ""
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    @property
    def best(self) -> Mix | None:
        return self.options[0] if self.options else None

    def kind(self, label: str) -> KindPlan:
        found = next((k for k in self.kinds if k.label == label), None)
        if found is None:
            raise InputError(f"no kind {label!r} in this fleet plan", hint=", ".join(k.label for k in self.kinds))
        return found

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["kinds"] = [k.to_dict() for k in self.kinds]
        out["options"] = [m.to_dict() for m in self.options]
        for name in ("slos", "ties", "notes"):
            out[name] = list(out[name])
        return json_safe(out)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetPlan:
        version = data.get("schema_version", 0)
        if version > SCHEMA_VERSION:
            raise InputError(f"this fleet plan was written by a newer tuner (schema {version} > {SCHEMA_VERSION})",
                             hint="upgrade tuner to read it")
        kw = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kw["kinds"] = tuple(KindPlan.from_dict(k) for k in kw.get("kinds", ()))
        kw["options"] = tuple(Mix.from_dict(m) for m in kw.get("options", ()))
        for name in ("slos", "ties", "notes"):
            kw[name] = tuple(kw.get(name, ()))
        kw["most_per_min"] = math.inf if kw.get("most_per_min") is None else kw["most_per_min"]
        return cls(**kw)


def units_of(kinds: tuple[KindPlan, ...] | list[KindPlan], unit: str) -> list[Unit]:
    """One :class:`~tuner.fleet.solver.Unit` (an engine) per kind that serves the model."""
    return [Unit(label=k.label, capacity=k.per_min(unit), cost=k.engine_cost, available=k.engines_available,
                 band=min(k.band.tokens_per_s, 0.95), gpus=k.tp or 1)
            for k in kinds if k.feasible and k.per_min(unit) > 0]


def write_fleet(plan: FleetPlan, folder: str | Path) -> Path:
    """The record as ``<folder>/fleet-plan.json`` (atomically); returns the path."""

    path = Path(folder) / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(plan.to_dict(), indent=1))
    return path


def load_fleet(path: str | Path) -> FleetPlan:
    """The fleet plan at ``path``: its ``fleet-plan.json``, or the folder holding it."""
    p = Path(path)
    if p.is_dir():
        p = p / RECORD
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"cannot read the fleet plan: {err.strerror}", path=p,
                         hint="run tuner plan --fleet FILE first") from None
    except ValueError as err:
        raise InputError(f"not a fleet plan (bad JSON: {err})", path=p) from None
    if not isinstance(data, dict) or "kinds" not in data:
        raise InputError("not a fleet plan (no kinds)", path=p)
    return FleetPlan.from_dict(data)


__all__ = ["RECORD", "SCHEMA_VERSION", "FleetPlan", "KindPlan", "load_fleet", "units_of", "write_fleet"]

"""The fleet file: the GPU kinds a team has or can rent (:class:`Kind`), the one model they
serve and how each kind's flags are searched (:class:`Fleet`), read with ``file:line`` errors
(:func:`read_fleet`). Shipped examples: ``search_spaces/fleets/`` (a name finds them).

    name: mixed-room
    model: qwen2.5-7b
    search: {space: default, budget: 8, requests: 400}
    kinds:
      V100-32GB-SXM2: {count: 8, gpu_hour_cost: 0.6, vllm_version: "0.6.3"}
      L4:             {count: 4, gpu_hour_cost: 0.8}
      H100-SXM:       {count: unlimited, gpu_hour_cost: 2.5}

A kind's key is its GPU's catalog name, or any label with ``gpu:`` naming it (the same GPU
twice, under two vLLM versions). ``count`` is how many GPUs there are (``unlimited`` for what
can be rented); ``gpu_hour_cost`` what one GPU-hour costs (for GPUs owned: whatever the team
charges for them, power and depreciation; 0 makes them free); ``max_tp`` the largest
tensor-parallel group one host gives (default: the count, at most 8).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError
from tuner.core.values import is_int, is_number, shown
from tuner.core.versions import parse_version
from tuner.core.yamlfile import read_yaml
from tuner.serving.config import DEFAULT_VLLM_VERSION, DTYPES, QUANTIZATIONS
from tuner.sim.hardware import get_gpu

#: Shipped fleet files (``--fleet NAME``), beside the shipped search spaces.
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "search_spaces" / "fleets"
_TOP = ("name", "description", "model", "dtype", "quantization", "search", "kinds")
_SEARCH = ("space", "budget", "requests")
_KIND = ("gpu", "count", "gpu_hour_cost", "vllm_version", "max_tp", "dtype", "quantization", "calibration")
#: The most trials a kind's search may take here: a fleet plan is asked often, a deep search is tuner search's job.
MAX_BUDGET = 200


@dataclass(frozen=True, slots=True)
class Kind:
    """One GPU kind of the fleet. ``count`` None: unlimited (rented)."""

    label: str
    gpu: str
    count: int | None
    gpu_hour_cost: float
    vllm_version: str = DEFAULT_VLLM_VERSION
    max_tp: int = 8
    dtype: str | None = None
    quantization: str | None = None
    calibration: str | None = None

    @property
    def count_text(self) -> str:
        return "unlimited" if self.count is None else f"{self.count}"

    def engines_available(self, tp: int) -> int | None:
        """Engines of ``tp`` GPUs the inventory holds (None: unlimited)."""
        return None if self.count is None else self.count // tp

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Fleet:
    """What a team has or can get, the model it serves, and each kind's search (the space,
    its trials and requests: :func:`tuner.search` on the simulator)."""

    name: str
    kinds: tuple[Kind, ...]
    model: str = "qwen2.5-7b"
    dtype: str = "auto"
    quantization: str | None = None
    space: str = "default"
    budget: int = 8
    requests: int = 400
    description: str = ""
    path: str = "<fleet>"

    def __post_init__(self) -> None:
        if not self.kinds:
            raise InputError("a fleet needs at least one GPU kind", path=self.path)
        labels = [k.label for k in self.kinds]
        if len(set(labels)) != len(labels):
            raise InputError(f"two kinds share a label: {', '.join(sorted({x for x in labels if labels.count(x) > 1}))}",  # noqa: E501
                             path=self.path)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "path": self.path, "model": self.model,
                "dtype": self.dtype, "quantization": self.quantization, "space": self.space, "budget": self.budget,
                "requests": self.requests, "kinds": [k.to_dict() for k in self.kinds]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fleet:
        kinds = tuple(Kind(**k) for k in data.get("kinds", ()))
        return cls(kinds=kinds, **{k: v for k, v in data.items() if k != "kinds"})


def resolve_fleet_path(name_or_path: str | Path) -> Path:
    """A path as given, else a shipped fleet by name (``article-004-room``), from
    ``./search_spaces/fleets`` first."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    for folder in (Path.cwd() / "search_spaces" / "fleets", SHIPPED_DIR):
        for candidate in (folder / f"{name_or_path}.yaml", folder / str(name_or_path)):
            if candidate.is_file():
                return candidate
    known = ", ".join(sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))) or "none"
    raise InputError(f"no fleet file {str(name_or_path)!r}", hint=f"give a YAML file or a shipped fleet: {known}")


def read_fleet(name_or_path: str | Path) -> Fleet:
    """The fleet file at ``name_or_path`` (or a shipped one by name), every value checked."""

    doc = read_yaml(resolve_fleet_path(name_or_path), what="fleet file")
    return _fleet(doc)


def _fleet(doc: Any) -> Fleet:
    data, path = doc.data, doc.path

    def fail(message: str, *key: Any, hint: str | None = None) -> InputError:
        return InputError(message, path=path, line=doc.line(key), hint=hint)

    if not isinstance(data, dict):
        raise fail("a fleet file is a mapping with kinds:", hint="see search_spaces/fleets/mixed-room.yaml")
    _known(data, _TOP, (), fail)
    kinds = data.get("kinds")
    if not isinstance(kinds, dict) or not kinds:
        raise fail("kinds: must map GPU kinds to {count, gpu_hour_cost, ...}", "kinds",
                   hint="e.g. kinds: {H100-SXM: {count: unlimited, gpu_hour_cost: 2.5}}")
    search = data.get("search") or {}
    if not isinstance(search, dict):
        raise fail(f"search: must be a mapping of {', '.join(_SEARCH)}, got {shown(search)}", "search")
    _known(search, _SEARCH, ("search",), fail)
    top = {k: _choice(data.get(k), k, fail) for k in ("dtype", "quantization")}
    return Fleet(
        name=_text(data.get("name"), ("name",), fail) or Path(path).stem,
        description=_text(data.get("description"), ("description",), fail) or "",
        kinds=tuple(_kind(str(label), entry, fail) for label, entry in kinds.items()),
        model=_text(data.get("model"), ("model",), fail) or "qwen2.5-7b",
        dtype=top["dtype"] or "auto", quantization=top["quantization"],
        space=_text(search.get("space"), ("search", "space"), fail) or "default",
        budget=_whole(search.get("budget", 8), ("search", "budget"), fail, 1, MAX_BUDGET),
        requests=_whole(search.get("requests", 400), ("search", "requests"), fail, 20, 100_000),
        path=path)


def _known(data: dict[str, Any], known: tuple[str, ...], where: tuple[Any, ...], fail: Any) -> None:
    for key in data:
        if key not in known:
            raise fail(f"unknown key {shown(key)}", *where, key, hint=f"known keys: {', '.join(known)}")


def _text(value: Any, where: tuple[Any, ...], fail: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise fail(f"{'.'.join(map(str, where))} must be text, got {shown(value)}", *where)
    return value.strip()


def _whole(value: Any, where: tuple[Any, ...], fail: Any, low: int, high: int) -> int:
    if not is_int(value) or not low <= value <= high:
        raise fail(f"{'.'.join(map(str, where))} must be a whole number in {low}-{high:,}, got {shown(value)}", *where)
    return int(value)


def _choice(value: Any, key: str, fail: Any, where: tuple[Any, ...] = ()) -> str | None:
    allowed = DTYPES if key == "dtype" else QUANTIZATIONS
    if value in (None, "none") and key == "quantization":
        return None
    if value is None:
        return None
    if value not in allowed:
        raise fail(f"{key} {shown(value)} is not one of {', '.join(str(a) for a in allowed if a)}", *where, key)
    return str(value)


def _kind(label: str, entry: Any, fail: Any) -> Kind:

    where = ("kinds", label)
    if not isinstance(entry, dict):
        raise fail(f"kinds.{label} must be a mapping of {', '.join(_KIND)}, got {shown(entry)}", *where)
    _known(entry, _KIND, where, fail)
    try:
        gpu = get_gpu(str(entry.get("gpu", label))).name
    except InputError as err:
        raise fail(err.message, *where, *(("gpu",) if "gpu" in entry else ()), hint=err.hint) from None
    count = entry.get("count")
    if count == "unlimited":
        count = None
    elif not is_int(count) or not 1 <= count <= 4096:
        raise fail(f"kinds.{label}.count must be a number of GPUs (1-4,096) or unlimited, got {shown(count)}",
                   *where, "count")
    price = entry.get("gpu_hour_cost")
    if not is_number(price) or not math.isfinite(price) or price < 0:
        raise fail(f"kinds.{label}.gpu_hour_cost must be the price of one GPU-hour (>= 0), got {shown(price)}",
                   *where, "gpu_hour_cost", hint="for GPUs you own, what you charge for them (power, depreciation)")
    version = entry.get("vllm_version", DEFAULT_VLLM_VERSION)
    if not isinstance(version, str):
        raise fail(f"kinds.{label}.vllm_version must be text, got {shown(version)}", *where, "vllm_version",
                   hint='quote it: vllm_version: "0.6.3" (0.10 would read as the number 0.1)')
    parse_version(version)
    max_tp = entry.get("max_tp", min(count or 8, 8))
    if not is_int(max_tp) or max_tp < 1 or max_tp & (max_tp - 1) or max_tp > 64:
        raise fail(f"kinds.{label}.max_tp must be a power of two in 1-64, got {shown(max_tp)}", *where, "max_tp")
    if count is not None and max_tp > count:
        raise fail(f"kinds.{label}.max_tp {max_tp} is more than its {count} GPUs", *where, "max_tp")
    calibration = _text(entry.get("calibration"), (*where, "calibration"), fail)
    if calibration is not None and not Path(calibration).expanduser().is_file():
        raise fail(f"kinds.{label}.calibration: no profile at {calibration}", *where, "calibration",
                   hint="give the profile.yaml tuner calibrate wrote")
    return Kind(label=label, gpu=gpu, count=count, gpu_hour_cost=float(price), vllm_version=version, max_tp=max_tp,
                dtype=_choice(entry.get("dtype"), "dtype", fail, where),
                quantization=_choice(entry.get("quantization"), "quantization", fail, where),
                calibration=calibration)


__all__ = ["Fleet", "Kind", "MAX_BUDGET", "SHIPPED_DIR", "read_fleet", "resolve_fleet_path"]

"""What a capacity plan found (:class:`CapacityEstimate`, one :class:`SweepPoint` per
measured load) and the pure arithmetic behind it: the largest load meeting the TTFT
target by monotone interpolation, conversations per minute, replicas for a demand, and
cost. :mod:`tuner.plan` runs the sweeps; this module only computes and serialises.

Definitions (article 004, section 7.2, does the same by hand):

* **conversations/min** = requests/s x 60 / requests per conversation when the workload
  has conversation ids; otherwise tokens/s x 60 / tokens per conversation (the article:
  5000 tokens/s x 60 / 300 tokens = 1000 conversations per minute).
* **replicas** = ceil(demand x (1 + headroom) / capacity): headroom is spare capacity on
  top of the demand (20% provisions 1.2x the demand).
* **cost per million tokens** = (GPU-hour price x GPUs of one deployment) / (tokens/s x 3600) x 1e6.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.errors import InputError
from tuner.jsonsafe import json_safe

#: Figures of an estimate that get a (min, max) range over repeats.
RANGED = ("max_load", "max_concurrency", "requests_per_s", "tokens_per_s", "output_tokens_per_s",
          "conversations_per_min", "ttft_p95_s", "replicas", "cost_per_million_tokens")


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One measured run. ``level`` is users (closed loop) or requests/s (open loop);
    ``role`` is ``sweep``, ``extend`` (added until the target broke) or ``verify`` (the run
    at the interpolated answer); ``repeat`` numbers the repeat (seed ``seed``)."""

    level: float
    load: str
    ttft_mean_s: float
    ttft_p95_s: float
    tpot_mean_s: float
    e2e_mean_s: float
    e2e_p95_s: float
    tokens_per_s: float
    output_tokens_per_s: float
    requests_per_s: float
    error_rate: float = 0.0
    requests: int = 0
    duration_s: float = 0.0
    role: str = "sweep"
    repeat: int = 0
    seed: int = 0
    tpot_p95_s: float = math.nan
    ttft_p99_s: float = math.nan

    def __post_init__(self) -> None:
        if not self.level > 0:
            raise InputError(f"a sweep level must be > 0, got {self.level}")
        if self.role not in ("sweep", "extend", "verify"):
            raise InputError(f"sweep point role {self.role!r} is not sweep, extend or verify")

    def meets(self, target_ttft_s: float, max_error_rate: float = 0.01) -> bool:
        """P95 TTFT within the target and at most ``max_error_rate`` of requests failed."""
        return (math.isfinite(self.ttft_p95_s) and self.ttft_p95_s <= target_ttft_s
                and self.error_rate <= max_error_rate)

    @classmethod
    def from_summary(cls, level: float, load: str, summary: dict[str, float], **extra: Any) -> SweepPoint:
        """From :meth:`tuner.result.RunResult.summary`."""
        nan = math.nan
        return cls(
            level=float(level), load=load,
            ttft_mean_s=summary.get("ttft_mean_s", nan), ttft_p95_s=summary.get("ttft_p95_s", nan),
            tpot_mean_s=summary.get("tpot_mean_s", nan), e2e_mean_s=summary.get("e2e_mean_s", nan),
            e2e_p95_s=summary.get("e2e_p95_s", nan), tokens_per_s=summary.get("tokens_per_s", nan),
            output_tokens_per_s=summary.get("output_tokens_per_s", nan),
            requests_per_s=summary.get("requests_per_s", nan), error_rate=summary.get("error_rate", 0.0),
            requests=int(summary.get("requests", 0)), duration_s=summary.get("duration_s", nan),
            tpot_p95_s=summary.get("tpot_p95_s", nan), ttft_p99_s=summary.get("ttft_p99_s", nan), **extra,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: json_safe(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepPoint:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: (math.nan if v is None and k not in ("load", "role") else v)
                      for k, v in data.items() if k in names})


#: How the replayed workload stands to the one the study searched on.
MATCHES = {
    "same": "the study's own requests",
    "first-rows": "the first rows of the study's file (--num-requests)",
    "same-mix": "another sample of the study's synthetic mix (same spec, other size or seed)",
    "other": "another workload, given on purpose (--trace)",
    "unchecked": "no study fingerprint to compare with",
}


@dataclass(frozen=True, slots=True)
class ReplayedWorkload:
    """The workload a plan replayed (its first repeat; further repeats replay other
    samples of it, as the estimate's notes say). ``file`` is the file read (absolute),
    ``None`` for a synthetic mix; ``match`` is one of :data:`MATCHES`, against the
    study's ``study_requests`` requests of fingerprint ``study_fingerprint``."""

    source: str
    requests: int
    fingerprint: str
    file: str | None = None
    match: str = "unchecked"
    study_fingerprint: str | None = None
    study_requests: int | None = None

    def __post_init__(self) -> None:
        if self.match not in MATCHES:
            raise InputError(f"replayed workload match {self.match!r} is not one of {', '.join(MATCHES)}")

    @property
    def matches_study(self) -> bool:
        """True when the plan replayed exactly the study's requests."""
        return self.match == "same"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "matches_study": self.matches_study}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ReplayedWorkload | None:
        """From :meth:`to_dict`, or a plan stored before this record (``source``,
        ``requests`` and ``fingerprint`` only: ``unchecked``); ``None`` for nothing."""
        if not data:
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        kw.setdefault("source", "unknown")
        kw.setdefault("requests", 0)
        kw.setdefault("fingerprint", "")
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    """How much traffic one configuration holds at a P95 TTFT target.

    Headline figures are those of the verified run at the largest load meeting the target
    (the median over repeats when ``repeats`` > 1, with ``ranges[name] = (min, max)``).
    ``max_load`` is on the sweep's axis (users, or requests/s for ``load_kind == "rate"``);
    ``max_concurrency`` is users for closed loop, Little's law (requests/s x mean E2E) for
    open loop. ``bound`` is ``"interpolated"`` or ``"at_least"`` (the target never broke
    up to the largest load tried). ``replicas``/costs are ``None`` without
    ``demand``/``gpu_hour_cost``. ``sweep`` holds every run of every repeat.
    ``workload`` says which requests were replayed and whether they are the study's.
    """

    target_ttft_s: float
    load_kind: str
    max_load: float
    max_concurrency: float
    requests_per_s: float
    tokens_per_s: float
    output_tokens_per_s: float
    ttft_mean_s: float
    ttft_p95_s: float
    e2e_mean_s: float
    tpot_mean_s: float
    interpolated_load: float
    bound: str
    verified: bool
    conversations_per_min: float
    conversation_basis: str  # "tokens" | "requests"
    tokens_per_conversation: float | None = None
    requests_per_conversation: float | None = None
    demand_per_min: float | None = None
    demand_unit: str = "conversations"
    headroom: float = 0.2
    replicas: int | None = None
    gpus: int = 1
    gpu_hour_cost: float | None = None
    cost_per_hour: float | None = None
    total_cost_per_hour: float | None = None
    cost_per_million_tokens: float | None = None
    cost_per_million_output_tokens: float | None = None
    repeats: int = 1
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    sweep: tuple[SweepPoint, ...] = ()
    notes: tuple[str, ...] = ()
    study: str | None = None
    trial: int | None = None
    backend: str = "sim"
    config: dict[str, Any] = field(default_factory=dict)
    deployment: dict[str, Any] = field(default_factory=dict)
    workload: ReplayedWorkload | None = None
    created: str = ""

    def __post_init__(self) -> None:
        if self.load_kind not in ("concurrency", "rate"):
            raise InputError(f"load_kind must be concurrency or rate, got {self.load_kind!r}")
        if self.bound not in ("interpolated", "at_least"):
            raise InputError(f"bound must be interpolated or at_least, got {self.bound!r}")
        if self.conversation_basis not in ("tokens", "requests"):
            raise InputError(f"conversation_basis must be tokens or requests, got {self.conversation_basis!r}")
        if not self.target_ttft_s > 0:
            raise InputError(f"target_ttft_s must be > 0, got {self.target_ttft_s}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (NaN/inf become ``None``); :meth:`from_dict` reads it back."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "sweep":
                value = [p.to_dict() for p in value]
            elif f.name == "ranges":
                value = {k: [json_safe(a), json_safe(b)] for k, (a, b) in value.items()}
            elif f.name == "notes":
                value = list(value)
            elif f.name == "workload":
                value = None if value is None else value.to_dict()
            elif isinstance(value, float):
                value = json_safe(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityEstimate:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        kw["sweep"] = tuple(SweepPoint.from_dict(p) for p in kw.get("sweep", ()))
        kw["ranges"] = {k: (v[0], v[1]) for k, v in (kw.get("ranges") or {}).items()}
        kw["notes"] = tuple(kw.get("notes", ()))
        kw["workload"] = ReplayedWorkload.from_dict(kw.get("workload"))
        return cls(**kw)


# -- interpolation ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Crossing:
    """Where P95 TTFT crosses the target. ``status``: ``between`` (``level`` interpolated
    between two measured loads), ``below`` (even the lowest load misses; ``level`` None),
    ``above`` (every load meets it; ``level`` is the largest measured)."""

    level: float | None
    status: str


def max_load_meeting(levels: Sequence[float], p95_ttft_s: Sequence[float], target_ttft_s: float) -> Crossing:
    """The largest load whose P95 TTFT meets the target, by monotone cubic (PCHIP)
    interpolation of P95 TTFT against load between the measured points.

    P95 TTFT is first made non-decreasing in load (running maximum: a measured dip after
    a miss is noise, not spare capacity), repeated levels are averaged, and NaN/inf (runs
    that failed or stopped) count as misses. PCHIP keeps monotone data monotone (Fritsch
    & Carlson 1980; ``scipy.interpolate.PchipInterpolator``), so the crossing is unique
    and no overshoot invents capacity between points."""
    from scipy.interpolate import PchipInterpolator
    from scipy.optimize import brentq

    if len(levels) != len(p95_ttft_s) or not len(levels):
        raise InputError("max_load_meeting needs as many P95 values as levels, at least one")
    x = np.asarray(levels, dtype=np.float64)
    y = np.asarray(p95_ttft_s, dtype=np.float64)
    y = np.where(np.isfinite(y), y, np.inf)
    xs = np.unique(x)
    ys = np.array([y[x == v].mean() for v in xs])
    ys = np.maximum.accumulate(ys)
    if ys[0] > target_ttft_s:
        return Crossing(None, "below")
    if ys[-1] <= target_ttft_s:
        return Crossing(float(xs[-1]), "above")
    i = int(np.flatnonzero(ys <= target_ttft_s)[-1])
    lo, hi = xs[i], xs[i + 1]
    if not math.isfinite(ys[i + 1]):  # a failed run above: no curve to follow, stay at the last good load
        return Crossing(float(lo), "between")
    finite = np.isfinite(ys)
    curve = PchipInterpolator(xs[finite], ys[finite])
    level = brentq(lambda t: float(curve(t)) - target_ttft_s, lo, hi, xtol=1e-9 * max(hi, 1.0))
    return Crossing(float(level), "between")


# -- conversations, demand, replicas, cost -----------------------------------------------
def requests_per_conversation(sessions: Sequence[str | None] | None) -> float | None:
    """Requests / distinct conversations, from per-request conversation ids (a request
    without an id is a conversation of its own); ``None`` when there are no ids."""
    if sessions is None or not any(s is not None for s in sessions):
        return None
    named = [s for s in sessions if s is not None]
    conversations = len(set(named)) + (len(sessions) - len(named))
    return len(sessions) / conversations


def conversations_per_min(*, tokens_per_s: float, requests_per_s: float,
                          tokens_per_conversation: float | None = None,
                          requests_per_conversation: float | None = None) -> float:
    """Tokens/s x 60 / tokens per conversation when that is given (it wins), else
    requests/s x 60 / requests per conversation."""
    if tokens_per_conversation is not None:
        if not tokens_per_conversation > 0:
            raise InputError(f"--tokens-per-conversation must be > 0, got {tokens_per_conversation}")
        return tokens_per_s * 60.0 / tokens_per_conversation
    if requests_per_conversation is None or not requests_per_conversation > 0:
        raise InputError("need tokens or requests per conversation to count conversations")
    return requests_per_s * 60.0 / requests_per_conversation


@dataclass(frozen=True, slots=True)
class Demand:
    """Traffic to serve: ``per_min`` conversations (or requests) per minute."""

    per_min: float
    unit: str = "conversations"

    def __post_init__(self) -> None:
        if not self.per_min >= 0 or not math.isfinite(self.per_min):
            raise InputError(f"demand must be a finite number >= 0 per minute, got {self.per_min}")
        if self.unit not in ("conversations", "requests"):
            raise InputError(f"demand unit must be conversations or requests, got {self.unit!r}")


_DEMAND_RE = re.compile(
    r"\s*([0-9]*\.?[0-9]+(?:e\d+)?)\s*(conversations?|convs?|requests?|reqs?)?\s*"
    r"(?:/|per\s*)?\s*(s|sec|second|m|min|minute|h|hr|hour)?\s*")


def parse_demand(text: str | float, unit: str = "conversations") -> Demand:
    """``"1200/min"``, ``"20/s"``, ``"72000/h"``, ``"1200"`` (per minute), ``"20 req/s"``,
    ``"1200 conv/min"``; the word picks the unit, else ``unit``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return Demand(float(text), unit)
    m = _DEMAND_RE.fullmatch(str(text).lower())
    if not m:
        raise InputError(f"cannot read demand {text!r}",
                         hint="write 1200/min, 20/s or 72000/h (conversations; add req for requests: 20req/s)")
    per = {"s": 60.0, "sec": 60.0, "second": 60.0, "h": 1 / 60, "hr": 1 / 60, "hour": 1 / 60}.get(m.group(3) or "min", 1.0)
    word = m.group(2) or ""
    if word.startswith("req"):
        unit = "requests"
    elif word.startswith("conv"):
        unit = "conversations"
    return Demand(float(m.group(1)) * per, unit)


def replicas_needed(demand_per_min: float, capacity_per_min: float, headroom: float = 0.2) -> int:
    """Deployments needed to serve ``demand_per_min`` with ``headroom`` spare:
    ceil(demand x (1 + headroom) / capacity); 0 for no demand."""
    if not headroom >= 0:
        raise InputError(f"--headroom must be >= 0, got {headroom}")
    if demand_per_min <= 0:
        return 0
    if not capacity_per_min > 0:
        raise InputError("capacity is 0 per minute: no number of replicas serves the demand")
    need = demand_per_min * (1.0 + headroom) / capacity_per_min
    return max(1, math.ceil(need * (1 - 1e-12)))  # 2500 x 1.2 / 1000 is 3.0000000000000004 in floats


def parse_fraction(text: str | float, what: str = "--headroom") -> float:
    """``"20%"``, ``"0.2"`` or ``0.2`` → 0.2."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        try:
            value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
        except ValueError:
            raise InputError(f"cannot read {what} {text!r}", hint="write 20% or 0.2") from None
    if not value >= 0 or not math.isfinite(value):
        raise InputError(f"{what} must be >= 0, got {text!r}")
    return value


def cost_figures(gpu_hour_cost: float, gpus: int, tokens_per_s: float, output_tokens_per_s: float,
                 replicas: int | None = None) -> dict[str, float | None]:
    """Cost per deployment-hour, per million tokens (in+out) and per million output tokens,
    and per hour for ``replicas`` deployments."""
    if not gpu_hour_cost >= 0:
        raise InputError(f"--gpu-hour-cost must be >= 0, got {gpu_hour_cost}")
    per_hour = gpu_hour_cost * gpus

    def per_million(rate: float) -> float | None:
        return per_hour / (rate * 3600.0) * 1e6 if rate > 0 else None

    return {
        "cost_per_hour": per_hour,
        "total_cost_per_hour": None if replicas is None else per_hour * replicas,
        "cost_per_million_tokens": per_million(tokens_per_s),
        "cost_per_million_output_tokens": per_million(output_tokens_per_s),
    }


__all__ = [
    "MATCHES", "CapacityEstimate", "Crossing", "Demand", "ReplayedWorkload", "SweepPoint", "conversations_per_min",
    "cost_figures",
    "max_load_meeting", "parse_demand", "parse_fraction", "replicas_needed", "requests_per_conversation",
]

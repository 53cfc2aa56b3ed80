"""What a capacity plan found (:class:`CapacityEstimate`, one :class:`SweepPoint` per
measured load), the largest load meeting the TTFT target by monotone interpolation, and
the study as the plans' storage (:func:`store_plan`, :func:`stored_plan`).
:mod:`tuner.plan` runs the sweeps; :mod:`tuner.serving.demand` turns a capacity into
conversations, replicas and cost; this module only computes and serialises.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.core.jsonsafe import json_safe
from tuner.core.units import parse_seconds
from tuner.serving.slo import MAX_ERROR_RATE, monotone_crossing, monotone_fit, within

if TYPE_CHECKING:
    import optuna

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
    #: The plan's SLO set there (:mod:`tuner.serving.slo`): the largest measured / bound, the SLO
    #: with the smallest margin (the limit at this load), and requests/s meeting every SLO.
    slo_ratio: float = math.nan
    binding_slo: str = ""
    goodput_requests_per_s: float = math.nan

    def __post_init__(self) -> None:
        if not self.level > 0:
            raise InputError(f"a sweep level must be > 0, got {self.level}")
        if self.role not in ("sweep", "extend", "verify"):
            raise InputError(f"sweep point role {self.role!r} is not sweep, extend or verify")

    def meets(self, target_ttft_s: float, max_error_rate: float = MAX_ERROR_RATE) -> bool:
        """P95 TTFT within the target, every other SLO of the plan met (``slo_ratio``, when
        the plan measured it) and at most ``max_error_rate`` of requests failed: the search's
        rule (:func:`tuner.serving.slo.within`)."""
        ttft = self.ttft_p95_s / target_ttft_s if math.isfinite(self.ttft_p95_s) else math.inf
        return within(ttft if math.isnan(self.slo_ratio) else max(ttft, self.slo_ratio), self.error_rate,
                      max_error_rate)

    @classmethod
    def from_summary(cls, level: float, load: str, summary: dict[str, float], **extra: Any) -> SweepPoint:
        """From :meth:`tuner.serving.result.RunResult.summary` (``slo_ratio`` and the like in ``extra``)."""
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
    slos: tuple[str, ...] = ()  #: the SLOs besides P95 TTFT the plan met
    binding_slo: str | None = None  #: the SLO that limits the chosen load
    goodput_requests_per_s: float | None = None  #: requests/s meeting every SLO there

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
            elif f.name in ("notes", "slos"):
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
        kw["slos"] = tuple(kw.get("slos", ()))
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
    """The largest load whose P95 TTFT meets the target, where the monotone fit of the
    measured points crosses it (:func:`tuner.serving.slo.monotone_fit` and
    :func:`~tuner.serving.slo.monotone_crossing`, the search's rule: a failed run is a miss, a
    load measured twice reads its worse value, a running maximum, PCHIP between points)."""
    if len(levels) != len(p95_ttft_s) or not len(levels):
        raise InputError("max_load_meeting needs as many P95 values as levels, at least one")
    points = list(zip(levels, p95_ttft_s))
    xs, ys = monotone_fit(points)
    if ys[0] > target_ttft_s:
        return Crossing(None, "below")
    if ys[-1] <= target_ttft_s:
        return Crossing(float(xs[-1]), "above")
    i = max(k for k, y in enumerate(ys) if y <= target_ttft_s)
    lo, hi = xs[i], xs[i + 1]
    level = monotone_crossing(points, target_ttft_s, lo, hi, xtol=1e-9 * max(hi, 1.0))
    # None: a failed run above (no curve to follow), or the crossing sits on ``lo``: stay there
    return Crossing(float(lo if level is None else level), "between")


# -- the study as storage -----------------------------------------------------------------
#: Study user attrs that hold a plan start with this.
ATTR_PREFIX = "plan/"


def plan_key(trial: int | None, target_ttft_s: float) -> str:
    """``plan/trial-3/ttft-5s`` (``trial-config`` for a configuration given directly)."""
    who = "config" if trial is None else str(trial)
    return f"{ATTR_PREFIX}trial-{who}/ttft-{target_ttft_s:g}s"


def store_plan(study: optuna.Study, estimate: CapacityEstimate) -> str:
    """Store the estimate (JSON) in the study's user attrs; returns the key."""
    key = plan_key(estimate.trial, estimate.target_ttft_s)
    study.set_user_attr(key, estimate.to_dict())
    return key


def list_plans(study: optuna.Study) -> dict[str, CapacityEstimate]:
    """Every stored plan of the study, by key."""
    return {k: CapacityEstimate.from_dict(v) for k, v in study.user_attrs.items() if k.startswith(ATTR_PREFIX)}


def stored_plan(study: optuna.Study, *, trial: int | None = None,
                target_ttft_s: float | str | None = None) -> CapacityEstimate | None:
    """The newest plan stored in ``study`` for ``trial`` at ``target_ttft_s`` (either may be
    left out), or ``None``."""

    target = None if target_ttft_s is None else parse_seconds(target_ttft_s, what="target")
    found = [e for e in list_plans(study).values()
             if (trial is None or e.trial == trial) and (target is None or math.isclose(e.target_ttft_s, target))]
    return max(found, key=lambda e: e.created, default=None)


__all__ = [
    "ATTR_PREFIX", "MATCHES", "CapacityEstimate", "Crossing", "ReplayedWorkload", "SweepPoint", "list_plans",
    "max_load_meeting", "plan_key", "store_plan", "stored_plan",
]

"""Service levels: what a load must meet (:class:`Slo`, :class:`SloSet`), which one binds,
the error-rate allowance, goodput as ``vllm bench serve --goodput`` counts it, and the
monotone crossing of a measured curve with a bound. Used by the search and the plan alike.

An SLO is a percentile of one metric of :mod:`tuner.serving.result` under a bound, written as
people write it: ``p95:ttft<=2s``, ``p99:tpot<=30ms``, ``p95:itl<=50ms``, ``p90:e2el<=20s``.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.core.units import parse_seconds
from tuner.serving.result import PERCENTILES

if TYPE_CHECKING:
    from tuner.serving.result import RunResult

#: Metric name (vLLM's) -> the column of :meth:`tuner.serving.result.RunResult.summary`.
METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}

#: Share of failed requests a load point tolerates (more: the replay stops, the point fails).
MAX_ERROR_RATE = 0.01

#: What a study's trials score at their edge (``--objective``) -> the unit its values are
#: told in: tokens/s (prompt + output), or goodput (requests/s of the requests meeting every
#: SLO, ``vllm bench serve --goodput``).
OBJECTIVES = {"tokens": "tok/s", "goodput": "req/s goodput"}

_FORM = re.compile(r"\s*p(\d+(?:\.\d+)?)\s*:\s*([a-z0-9_]+)\s*<=\s*(\S.*?)\s*")
_EXAMPLE = "write it as p95:ttft<=2s, p99:tpot<=30ms, p95:itl<=50ms or p90:e2el<=20s"


@dataclass(frozen=True, slots=True)
class Slo:
    """``percentile`` (one of :data:`tuner.serving.result.PERCENTILES`) of ``metric`` (a key of
    :data:`METRICS`) at most ``bound_s`` seconds."""

    percentile: int
    metric: str
    bound_s: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise InputError(f"SLO metric {self.metric!r} is not one of {', '.join(METRICS)}", hint=_EXAMPLE)
        if self.percentile not in PERCENTILES:
            raise InputError(f"SLO percentile p{self.percentile:g} is not one of "
                             f"{', '.join(f'p{p}' for p in PERCENTILES)}", hint=_EXAMPLE)
        if not (isinstance(self.bound_s, (int, float)) and 0 < self.bound_s < math.inf):
            raise InputError(f"SLO bound must be > 0 seconds, got {self.bound_s!r}", hint=_EXAMPLE)

    @property
    def key(self) -> str:
        """Its column in a run's summary: ``ttft_p95_s``."""
        return f"{METRICS[self.metric]}_p{self.percentile}_s"

    @property
    def name(self) -> str:
        """``p95_ttft``: its Optuna constraint is ``p95_ttft_over_target`` (:attr:`constraint`)."""
        return f"p{self.percentile}_{self.metric}"

    @property
    def constraint(self) -> str:
        """The name of its Optuna constraint (measured / bound - 1): ``p99_tpot_over_target``."""
        return f"{self.name}_over_target"

    def bound_text(self, space: str = "") -> str:
        """``30ms`` or ``2s`` (``30 ms`` with ``space=" "``)."""
        return f"{self.bound_s * 1e3:g}{space}ms" if self.bound_s < 1 else f"{self.bound_s:g}{space}s"

    @property
    def text(self) -> str:
        """As typed: ``p99:tpot<=30ms``."""
        return f"p{self.percentile}:{self.metric}<={self.bound_text()}"

    def label(self) -> str:
        """``P99 TPOT``."""
        return f"P{self.percentile} {self.metric.upper()}"

    def measured(self, summary: Mapping[str, float]) -> float:
        """Its percentile in ``summary`` (NaN when the run measured none)."""
        value = summary.get(self.key, math.nan)
        return float(value) if value is not None else math.nan

    def ratio(self, summary: Mapping[str, float]) -> float:
        """Measured / bound (``inf`` when nothing was measured): <= 1 meets it."""
        value = self.measured(summary)
        return value / self.bound_s if math.isfinite(value) else math.inf

    def meets(self, summary: Mapping[str, float]) -> bool:
        """Measured within the bound (:meth:`ratio` <= 1; nothing measured: not met)."""
        return self.ratio(summary) <= 1.0


def within(ratio: float, error_rate: float | None, max_error_rate: float = MAX_ERROR_RATE) -> bool:
    """What "meets the target" means, for the search's load points and the plan's alike:
    the largest measured / bound at most 1 (NaN or inf, nothing measured: not met) and at
    most ``max_error_rate`` of the requests failed."""
    return ratio <= 1.0 and float(error_rate or 0.0) <= max_error_rate


def value_text(value: float, objective: str = "tokens") -> str:
    """A trial's value in its objective's unit: ``27,062 tok/s``, ``37.71 req/s goodput``."""
    unit = OBJECTIVES.get(objective, objective)
    return f"{value:,.0f} {unit}" if objective == "tokens" else f"{value:,.2f} {unit}"


def parse_slo(text: str) -> Slo:
    """``p95:ttft<=2s`` -> :class:`Slo`; a one-line :class:`InputError` quoting ``text``."""
    if isinstance(text, Slo):
        return text
    m = _FORM.fullmatch(str(text).lower())
    if not m:
        raise InputError(f"cannot read SLO {str(text)!r}", hint=_EXAMPLE)
    pct, metric, bound = m.groups()
    try:
        percentile = float(pct)
        return Slo(int(percentile) if percentile.is_integer() else percentile,  # type: ignore[arg-type]
                   metric, parse_seconds(bound, what="bound"))
    except InputError as err:
        raise InputError(f"SLO {str(text)!r}: {err.message}", hint=err.hint or _EXAMPLE) from err


def split_slos(texts: Iterable[str | Slo]) -> tuple[float | None, tuple[str, ...]]:
    """SLO texts -> (the P95 TTFT bound among them or ``None``, the others as texts)."""
    found = SloSet.parse(texts)
    if found is None:
        return None, ()
    return found.target_ttft_s, found.other_texts


@dataclass(frozen=True, slots=True)
class SloSet:
    """The service levels a load point must meet, all of them, with at most
    ``max_error_rate`` of its requests failed. The first P95 TTFT one, if any, is the
    study's ``target_ttft_s`` (what studies written before SLO sets stored)."""

    slos: tuple[Slo, ...]
    max_error_rate: float = MAX_ERROR_RATE

    def __post_init__(self) -> None:
        if not self.slos:
            raise InputError("a service-level set needs at least one SLO", hint=_EXAMPLE)
        seen: dict[str, Slo] = {}
        for s in self.slos:
            if s.name in seen and seen[s.name] != s:
                raise InputError(f"two bounds for {s.label()}: {seen[s.name].text} and {s.text}",
                                 hint="give each percentile of a metric once")
            seen[s.name] = s

    @classmethod
    def ttft(cls, target_s: float) -> SloSet:
        """The default: P95 TTFT at most ``target_s``."""
        return cls((Slo(95, "ttft", float(target_s)),))

    @classmethod
    def of(cls, target: float | str | SloSet | Iterable[str | Slo]) -> SloSet:
        """From a P95 TTFT target (seconds), a set, one SLO text or several."""
        if isinstance(target, SloSet):
            return target
        if isinstance(target, (int, float)) and not isinstance(target, bool):
            return cls.ttft(float(target))
        slos = tuple(dict.fromkeys(parse_slo(t) for t in ((target,) if isinstance(target, (str, Slo)) else target)))
        return cls(slos)

    @classmethod
    def parse(cls, texts: Iterable[str | Slo] = (), target_ttft_s: float | str | None = None) -> SloSet | None:
        """What a user typed, read once at the edge: SLO texts (``--slo``, a space's ``slos``)
        and a P95 TTFT target (``--target-ttft``: seconds or ``"2s"``, the same SLO) as one set,
        P95 TTFT first; ``None`` when neither says anything. Two different P95 TTFT bounds are
        one :class:`InputError`."""
        slos = list(dict.fromkeys(parse_slo(t) for t in texts))
        if target_ttft_s is not None:
            slos.insert(0, Slo(95, "ttft", parse_seconds(target_ttft_s, what="target_ttft_s")))
        ttfts = list(dict.fromkeys(s.bound_s for s in slos if s.name == "p95_ttft"))
        if len(ttfts) > 1:
            raise InputError(f"two bounds for P95 TTFT: {ttfts[0]:g}s and {ttfts[1]:g}s",
                             hint="give --slo p95:ttft once (--target-ttft is the same SLO)")
        ordered = [s for s in slos if s.name == "p95_ttft"][:1] + [s for s in slos if s.name != "p95_ttft"]
        return cls(tuple(dict.fromkeys(ordered))) if ordered else None

    def with_target(self, target_s: float) -> SloSet:
        """The set with its P95 TTFT bound set to ``target_s`` (first, as a study stores it)."""
        return SloSet((Slo(95, "ttft", float(target_s)), *self.others), self.max_error_rate)

    def or_target(self, target_s: float) -> SloSet:
        """The set, with P95 TTFT at most ``target_s`` where it names no P95 TTFT bound of its
        own (a space's target under SLOs given without one)."""
        return self if self.target_ttft_s is not None else self.with_target(target_s)

    @property
    def others(self) -> tuple[Slo, ...]:
        """Its SLOs other than P95 TTFT (what a study stores beside ``target_ttft_s``)."""
        return tuple(s for s in self.slos if s.name != "p95_ttft")

    @property
    def other_texts(self) -> tuple[str, ...]:
        return tuple(s.text for s in self.others)

    @property
    def needs_itl(self) -> bool:
        """Whether an SLO bounds the inter-token latency: a run must record every token's gap."""
        return any(s.metric == "itl" for s in self.slos)

    @property
    def target_ttft_s(self) -> float | None:
        """The P95 TTFT bound, or ``None`` when the set has none."""
        return next((s.bound_s for s in self.slos if s.name == "p95_ttft"), None)

    @property
    def only_ttft(self) -> bool:
        """Just P95 TTFT: the study of ``--target-ttft`` alone, named and scored as before."""
        return len(self.slos) == 1 and self.slos[0].name == "p95_ttft"

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(s.text for s in self.slos)

    def describe(self) -> str:
        """``P95 TTFT <= 2 s, P99 TPOT <= 30 ms``."""
        return ", ".join(f"{s.label()} <= {s.bound_text(' ')}" for s in self.slos)

    def key(self) -> str:
        """For a study's name: ``""`` for P95 TTFT alone (as before SLO sets), else the
        other SLOs, sorted (``.p99tpot30ms``)."""
        if self.only_ttft:
            return ""
        others = sorted(s.text.replace(":", "").replace("<=", "") for s in self.slos if s.name != "p95_ttft")
        return "." + ".".join(others)

    def ratios(self, summary: Mapping[str, float]) -> dict[str, float]:
        """Measured / bound per SLO (by :attr:`Slo.name`)."""
        return {s.name: s.ratio(summary) for s in self.slos}

    def ratio(self, summary: Mapping[str, float]) -> float:
        """The largest measured / bound: <= 1 meets every SLO."""
        return max(self.ratios(summary).values())

    def binding(self, summary: Mapping[str, float]) -> Slo:
        """The SLO with the smallest margin (the first listed on a tie)."""
        return max(self.slos, key=lambda s: s.ratio(summary))

    def meets(self, summary: Mapping[str, float]) -> bool:
        """Every SLO met, and at most :attr:`max_error_rate` of requests failed (:func:`within`)."""
        return within(self.ratio(summary), summary.get("error_rate", 0.0), self.max_error_rate)

    def constraints(self, ratios: Mapping[str, float] | None, floor: float | None = None) -> dict[str, float]:
        """One Optuna constraint per SLO (:attr:`Slo.constraint`): measured / bound - 1, 1.0
        where nothing was measured (or for a refusal: ``ratios`` None); at least ``floor``
        when given."""
        out = {}
        for s in self.slos:
            r = (ratios or {}).get(s.name, math.inf)
            c = r - 1.0 if math.isfinite(r) else 1.0
            out[s.constraint] = max(c, floor) if floor is not None else c
        return out

    def over_text(self, summary: Mapping[str, float]) -> str:
        """How a run missed: ``P95 TTFT 2.4 s over the 2 s target`` (P95 TTFT alone, as
        before SLO sets), else ``P99 TPOT 41 ms over its 30 ms bound (p99:tpot<=30ms binds)``."""
        slo = self.binding(summary)
        value = slo.measured(summary)
        if self.only_ttft:
            return f"P95 TTFT {value:.3g} s over the {slo.bound_s:g} s target"
        shown = f"{value * 1e3:.3g} ms" if slo.bound_s < 1 else f"{value:.3g} s"
        return f"{slo.label()} {shown} over its {slo.bound_text(' ')} bound ({slo.text} binds)"

    def fields(self, summary: Mapping[str, float], constraints: Mapping[str, float]) -> dict[str, object]:
        """What a measurement's record says of the set at a load: the goodput there, the SLO
        that binds (:meth:`binding`) and, for a set beyond P95 TTFT, its ``constraints``."""
        out: dict[str, object] = {"binding_slo": self.binding(summary).text,
                                  "goodput_requests_per_s": summary.get("goodput_requests_per_s")}
        if not self.only_ttft:
            out["constraints"] = dict(constraints)
        return out

    def goodput(self, result: RunResult) -> float:
        """Requests/s of requests that completed meeting every per-request bound, as
        ``vllm bench serve --goodput`` counts them (vllm/benchmarks/serve.py,
        ``calculate_metrics``: a successful request is good when its TTFT, TPOT and E2EL
        are each <= the bound given for that metric, TPOT counted 0 for outputs of at
        most one token; ``request_goodput = good_completed / dur_s``). ITL is not a
        per-request figure and vLLM's ``--goodput`` takes no ``itl``: an ITL SLO bounds
        the percentile only. A metric with two SLOs is held to the tighter bound."""
        import numpy as np  # heavy: not loaded by what only reads SLOs (a command's --help)

        dur = result.duration_s
        if not len(result) or not dur > 0:
            return math.nan
        good = result.ok.copy()
        tpot = np.nan_to_num(result.tpot_s, nan=0.0)  # NaN: one token (or failed, already not ok)
        columns = {"ttft": result.ttft_s, "tpot": tpot, "e2el": result.e2e_s}
        for s in self.slos:
            if s.metric in columns:
                with np.errstate(invalid="ignore"):
                    good &= np.asarray(columns[s.metric]) <= s.bound_s
        return float(good.sum()) / dur


def monotone_fit(points: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The measured ``(load, y)`` points (y: a percentile, or measured / bound) as one
    non-decreasing curve, the one rule of the search and the plan alike: y NaN or inf (a
    run that measured nothing) is a miss (inf); a load measured more than once reads its
    largest y, as the confirmation race holds a configuration only when every measurement
    met the target (a mean would let one lucky pass hide a miss and invent capacity);
    then a running maximum (a dip after a miss is noise, not spare capacity; a replay
    stopped early is a lower bound already over the target)."""
    xs: list[float] = []
    ys: list[float] = []
    for x, y in sorted((float(x), float(y) if math.isfinite(y) else math.inf) for x, y in points if math.isfinite(x)):
        y = max(y, ys[-1]) if ys else y
        if xs and x == xs[-1]:
            ys[-1] = max(ys[-1], y)
            continue
        xs.append(x)
        ys.append(y)
    return xs, ys


def monotone_crossing(points: Iterable[tuple[float, float]], target: float, lo: float, hi: float, *,
                      xtol: float = 1e-3) -> float | None:
    """Where the monotone fit (:func:`monotone_fit`) of every measured ``(load, y)`` crosses
    ``target`` between ``lo`` (passes) and ``hi`` (fails): a shape-preserving PCHIP through
    its finite points (Fritsch & Carlson 1980, scipy's ``PchipInterpolator``: monotone data
    stays monotone, so the crossing is unique and no overshoot invents capacity). None when
    the fit cannot place it (fewer than two finite points, or no crossing inside)."""
    from scipy.interpolate import PchipInterpolator
    from scipy.optimize import brentq

    curve = [(x, y) for x, y in zip(*monotone_fit(points)) if math.isfinite(y)]
    if len(curve) < 2 or not (lo < hi):
        return None
    xs, ys = zip(*curve)
    f = PchipInterpolator(xs, ys, extrapolate=False)
    g = lambda x: float(f(x)) - target  # noqa: E731
    a, b = max(lo, xs[0]), min(hi, xs[-1])
    if not (a < b) or not (math.isfinite(g(a)) and math.isfinite(g(b))) or g(a) > 0 or g(b) <= 0:
        return None
    return float(brentq(g, a, b, xtol=xtol))


__all__ = ["MAX_ERROR_RATE", "METRICS", "OBJECTIVES", "Slo", "SloSet", "monotone_crossing", "monotone_fit", "parse_slo",
           "split_slos", "value_text", "within"]

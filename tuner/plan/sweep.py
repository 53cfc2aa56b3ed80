"""The load sweep of one started configuration, and how it is asked for (:class:`Sweep`):
levels run, extended until the target breaks, the crossing interpolated and verified
between the last load that held and the first that broke (:func:`sweep_once`,
:func:`locate`), and the figures at the answer (:func:`figures_at`)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.core.errors import InputError, NoFeasibleConfig
from tuner.search import EDGE_TOLERANCE, edge_width, load_for
from tuner.serving.capacity import SweepPoint, max_load_meeting
from tuner.serving.demand import Demand, conversations_per_min, cost_figures, replicas_needed
from tuner.serving.slo import MAX_ERROR_RATE

if TYPE_CHECKING:
    from tuner.runtime.progress import Observer
    from tuner.serving.result import RunResult
    from tuner.serving.slo import SloSet
    from tuner.traffic.workload import Workload

#: Article 004's concurrency levels (section 5).
ARTICLE_LEVELS = (5, 10, 20, 50, 80, 120, 160)

EXTEND_FACTOR = 1.5

MAX_EXTENSIONS = 8

#: Runs at most between the last load that held and the first that broke (:func:`locate`):
#: a bisection of 160 users to one takes 8.
MAX_VERIFY_RUNS = 8

#: The most requests plan grows a synthetic workload to while the edge lies above half of
#: it (closed loop: users are capped at half the requests, so a run is more than one burst).
MAX_REQUESTS = 16_000


@dataclass(frozen=True, slots=True)
class Sweep:
    """How a plan sweeps the load. ``levels`` are closed-loop users (default
    :data:`ARTICLE_LEVELS`, stopping at the first level over the target; levels given are
    all run); ``rates`` (requests/s) switch to open loop. Above the last level the sweep
    goes on in x1.5 steps while the target holds (``max_extensions``). ``repeats`` > 1
    reruns it on other samples (seed + k) for min-max ranges; ``requests`` per run (the
    first rows of a file, or that many of a synthetic mix, default :data:`~tuner.plan.workload.PLAN_REQUESTS`
    or the study's count); ``time_scale`` multiplies measured times (default the
    backend's: a server running faster than real time)."""

    levels: Sequence[float] | None = None
    rates: Sequence[float] | None = None
    max_extensions: int = MAX_EXTENSIONS
    repeats: int = 1
    seed: int = 0
    requests: int | None = None
    time_scale: float | None = None
    #: How close the load that held and the one that broke end up (:func:`locate`): this share
    #: of the load; default the planned trial's search's, else the search's ``EDGE_TOLERANCE``.
    tolerance: float | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise InputError(f"--repeats must be >= 1, got {self.repeats}")
        if self.tolerance is not None and not 0 < self.tolerance < 1:
            raise InputError(f"the edge tolerance must be a share in (0, 1), got {self.tolerance}")
        if self.levels is not None and self.rates is not None:
            raise InputError("give concurrency levels or rates, not both")
        grid = self.grid
        if not grid or any(not v > 0 for v in grid):
            raise InputError(f"load levels must be > 0, got {grid}")
        for name in ("levels", "rates"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def kind(self) -> str:
        """``concurrency`` (closed loop) or ``rate`` (open loop)."""
        return "rate" if self.rates is not None else "concurrency"

    @property
    def default_grid(self) -> bool:
        return self.rates is None and self.levels is None

    @property
    def grid(self) -> list[float]:
        """The levels to run, users as whole numbers."""
        grid = [float(v) for v in (self.rates if self.rates is not None else (self.levels or ARTICLE_LEVELS))]
        return grid if self.kind == "rate" else [float(int(v)) for v in grid]


# -- running ------------------------------------------------------------------------------
def rescale(result: RunResult, factor: float) -> RunResult:
    """The run as the simulated GPU would have timed it: every time x ``factor``."""
    if factor == 1.0:
        return result

    def s(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a, dtype=np.float64) * factor

    return dataclasses.replace(result, send_s=s(result.send_s), ttft_s=s(result.ttft_s), e2e_s=s(result.e2e_s),
                               queue_s=s(result.queue_s), issue_s=s(result.issue_s), itl_s=s(result.itl_s),
                               ttft_kernel_s=s(result.ttft_kernel_s),
                               duration_s=result.duration_s * factor)


class Sweeper:
    """Runs load levels on one started instance, for one repeat."""

    def __init__(self, instance: Any, workload: Workload, kind: str, *, time_scale: float, repeat: int,
                 seed: int, observer: Observer, slos: SloSet | None = None) -> None:
        self.instance, self.workload, self.kind, self.slos = instance, workload, kind, slos
        self.time_scale, self.repeat, self.seed, self.observer = time_scale, repeat, seed, observer
        self.points: list[SweepPoint] = []

    def run(self, level: float, role: str) -> SweepPoint:

        offered = level * self.time_scale if self.kind == "rate" else level
        load = load_for(self.kind, offered, self.workload, self.seed)
        label = f"{int(level)} users" if self.kind == "concurrency" else f"{level:.4g} req/s"
        self.observer.on_phase(f"repeat {self.repeat + 1}: {role} run at {label}")
        result = rescale(self.instance.run(self.workload, load), self.time_scale)
        summary = result.summary()
        extra: dict[str, Any] = {}
        if self.slos is not None:
            extra = {"slo_ratio": self.slos.ratio(summary), "binding_slo": self.slos.binding(summary).text,
                     "goodput_requests_per_s": self.slos.goodput(result)}
        point = SweepPoint.from_summary(level, label, summary, role=role, repeat=self.repeat, seed=self.seed, **extra)
        self.points.append(point)
        return point

    def measured(self, level: float) -> SweepPoint | None:
        return next((p for p in self.points if p.level == level), None)


def _snap(level: float, kind: str) -> float:
    return float(max(1, math.floor(level + 1e-9))) if kind == "concurrency" else float(level)


def sweep_once(sw: Sweeper, levels: Sequence[float], target: float, *, max_extensions: int,
               cap: float, notes: list[str], stop_at_miss: bool = False,
               tolerance: float | None = None) -> tuple[SweepPoint, float, str, bool]:
    """Steps 1-3 for one repeat: (chosen point, interpolated level, bound, verified).
    With ``stop_at_miss`` the sweep ends at the first level over the target (kept, so that
    the curve brackets the edge); loads beyond it are not run."""

    kind = sw.kind
    todo = sorted(set(levels))
    for i, level in enumerate(todo):
        point = sw.run(level, "sweep")
        if stop_at_miss and not point.meets(target, MAX_ERROR_RATE) and i + 1 < len(todo):
            skipped = ", ".join(f"{v:g}" for v in todo[i + 1:])
            notes.append(f"the sweep stopped at {point.load}, the first load over the target ({skipped} not run)")
            break

    def height(p: SweepPoint) -> float:
        """P95 TTFT, or with more SLOs the largest measured / bound in units of the target."""
        if p.error_rate > MAX_ERROR_RATE:
            return math.inf
        return p.ttft_p95_s if sw.slos is None or sw.slos.only_ttft else p.slo_ratio * target

    def curve() -> tuple[list[float], list[float]]:
        pts = sorted(sw.points, key=lambda p: p.level)
        return [p.level for p in pts], [height(p) for p in pts]

    crossing = max_load_meeting(*curve(), target)
    while crossing.status == "below":  # even the lowest load misses: go down
        low = min(p.level for p in sw.points)
        nxt = _snap(low / 2, kind)
        if nxt >= low or (kind == "rate" and nxt < min(levels) / 64):
            worst = min(sw.points, key=lambda p: p.level)
            if worst.error_rate > MAX_ERROR_RATE:
                raise NoFeasibleConfig(
                    f"{worst.error_rate:.0%} of requests failed at {worst.load}, more than {MAX_ERROR_RATE:.0%}, "
                    f"even at the lowest load: this configuration cannot serve this workload",
                )
            if worst.binding_slo and not worst.binding_slo.startswith("p95:ttft") and worst.slo_ratio > 1:
                raise NoFeasibleConfig(f"{worst.binding_slo} is missed at {worst.load} even at the lowest load "
                                       f"({worst.slo_ratio:.2f}x its bound): this configuration cannot meet it")
            raise NoFeasibleConfig(
                f"P95 TTFT {worst.ttft_p95_s:.3g} s at {worst.load} is over the {target:g} s target even at "
                f"the lowest load: this configuration cannot meet it",
            )
        sw.run(nxt, "extend")
        crossing = max_load_meeting(*curve(), target)
    extensions = 0
    while crossing.status == "above" and extensions < max_extensions:  # never broke: go up
        top = max(p.level for p in sw.points)
        nxt = min(top * EXTEND_FACTOR, cap)
        nxt = float(math.ceil(nxt)) if kind == "concurrency" else nxt
        if nxt <= top:
            break
        sw.run(nxt, "extend")
        extensions += 1
        crossing = max_load_meeting(*curve(), target)
    if crossing.status == "above":
        top = max(sw.points, key=lambda p: p.level)
        notes.append(f"P95 TTFT stayed under the target up to {top.load} (the largest load tried"
                     f"{', capped at half the workload' if top.level >= cap else ''}): capacity is at least this")
        return top, top.level, "at_least", True
    return locate(sw, curve, target, notes=notes, tolerance=tolerance)


def _bracket(sw: Sweeper, target: float) -> tuple[SweepPoint, SweepPoint | None]:
    """The largest load run that held below the smallest that broke, and that one."""
    broke = [p for p in sw.points if not p.meets(target, MAX_ERROR_RATE)]
    bad = min(broke, key=lambda p: p.level) if broke else None
    held = [p for p in sw.points if p.meets(target, MAX_ERROR_RATE) and (bad is None or p.level < bad.level)]
    if not held:
        raise NoFeasibleConfig(f"no load met the {target:g} s P95 TTFT target on verification")
    return max(held, key=lambda p: p.level), bad


def locate(sw: Sweeper, curve: Callable[[], tuple[list[float], list[float]]], target: float, *, notes: list[str],
           tolerance: float | None = None) -> tuple[SweepPoint, float, str, bool]:
    """Step 3, the crossing verified: a run at the interpolated crossing, then runs between the
    last load that held and the first that broke (at the crossing of the monotone fit, kept a
    quarter of the gap off either end: a bisection at worst) until the two are within the
    search's :func:`~tuner.search.edge_width` (``tolerance`` of the load, default the search's
    ``EDGE_TOLERANCE``; closed loop at least one user), or :data:`MAX_VERIFY_RUNS` are spent. The
    answer is always a load that was run and held: (that point, the fit's crossing,
    ``interpolated``, True)."""

    tolerance = EDGE_TOLERANCE if tolerance is None else tolerance
    kind, first = sw.kind, True
    level = _snap(float(max_load_meeting(*curve(), target).level), kind)
    for _ in range(MAX_VERIFY_RUNS):
        good, bad = _bracket(sw, target)
        if bad is None or bad.level - good.level <= edge_width(good.level, kind, tolerance):
            break
        if not first:
            fitted = max_load_meeting(*curve(), target).level
            margin = 0.25 * (bad.level - good.level)
            level = _snap(min(max(fitted or good.level, good.level + margin), bad.level - margin), kind)
        if kind == "concurrency":
            level = min(max(level, good.level + 1), bad.level - 1)
        point = sw.measured(level) or sw.run(level, "verify")
        if first and not point.meets(target, MAX_ERROR_RATE):
            notes.append(_missed(point, target))
        first = False
    good, bad = _bracket(sw, target)
    if bad is not None and bad.level - good.level > edge_width(good.level, kind, tolerance):
        notes.append(f"the edge lies between {good.load} (held) and {bad.load} (broke): not located closer in "
                     f"{MAX_VERIFY_RUNS} verify runs")
    return good, float(max_load_meeting(*curve(), target).level or good.level), "interpolated", True


def _missed(point: SweepPoint, target: float) -> str:
    if not point.slo_ratio > 1 or point.binding_slo.startswith("p95:ttft"):
        return f"verify run at {point.load} missed (P95 TTFT {point.ttft_p95_s:.3g} s > {target:g} s); stepped down"
    return f"verify run at {point.load} missed ({point.binding_slo} at {point.slo_ratio:.2f}x its bound); stepped down"


def sweep_growing(make: Callable[[Workload], Sweeper], wl: Workload, levels: Sequence[float], target: float, *,
                  max_extensions: int, notes: list[str], stop_at_miss: bool,
                  grow: Callable[[int], Workload] | None, fixed: str = "",
                  tolerance: float | None = None) -> tuple[tuple[SweepPoint, float, str, bool], Sweeper]:
    """:func:`sweep_once` on ``wl`` (a :class:`Sweeper` from ``make``), growing the workload
    while the edge lies above it: when the target still holds at the cap of half its
    requests (closed loop), ``grow(n)`` gives twice the requests of the same mix, the
    loads below are kept, and the sweep goes on from the last load on the larger workload,
    until the edge is bracketed or :data:`MAX_REQUESTS` is reached (a note says which).
    ``grow`` None (a file's rows, or a request count given): the capacity stays a lower
    bound, and the note says why (``fixed``) and what to give."""
    carried: list[SweepPoint] = []
    while True:
        sw = make(wl)
        sw.points = list(carried)
        cap = float(max(1, len(wl) // 2)) if sw.kind == "concurrency" else math.inf
        said: list[str] = []
        got = sweep_once(sw, levels, target, max_extensions=max_extensions, cap=cap, notes=said,
                         stop_at_miss=stop_at_miss, tolerance=tolerance)
        point, bound = got[0], got[2]
        capped = bound == "at_least" and point.level >= cap
        if not capped or grow is None or 2 * len(wl) > MAX_REQUESTS:
            notes += said
            if capped:
                notes.append(f"the workload's {len(wl):,} requests hold no more than {cap:,.0f} users"
                             + (f" ({fixed})" if grow is None else
                                f" ({MAX_REQUESTS:,} requests is the most plan grows it to; give -n to replay more)"))
            return got, sw
        n = 2 * len(wl)
        notes.append(f"P95 TTFT held up to {point.load}, half the {len(wl):,} requests: the sweep went on with "
                     f"{n:,} requests of the same mix")
        carried = [p for p in sw.points if p.level < point.level]
        levels = [point.level]
        wl = grow(n)


def figures_at(point: SweepPoint, kind: str, *, tpc: float | None, rpc: float | None, demand: Demand | None,
             headroom: float, gpu_hour_cost: float | None, gpus: int) -> dict[str, Any]:
    conc = point.level if kind == "concurrency" else point.requests_per_s * point.e2e_mean_s
    cpm = conversations_per_min(tokens_per_s=point.tokens_per_s, requests_per_s=point.requests_per_s,
                                tokens_per_conversation=tpc, requests_per_conversation=None if tpc else rpc)
    out: dict[str, Any] = {
        "max_load": point.level, "max_concurrency": conc, "requests_per_s": point.requests_per_s,
        "tokens_per_s": point.tokens_per_s, "output_tokens_per_s": point.output_tokens_per_s,
        "ttft_mean_s": point.ttft_mean_s, "ttft_p95_s": point.ttft_p95_s, "e2e_mean_s": point.e2e_mean_s,
        "tpot_mean_s": point.tpot_mean_s, "conversations_per_min": cpm, "replicas": None,
    }
    if demand is not None:
        capacity = cpm if demand.unit == "conversations" else point.requests_per_s * 60.0
        out["replicas"] = replicas_needed(demand.per_min, capacity, headroom)
    if gpu_hour_cost is not None:
        out.update(cost_figures(gpu_hour_cost, gpus, point.tokens_per_s, point.output_tokens_per_s, out["replicas"]))
    return out


__all__ = ["ARTICLE_LEVELS", "EXTEND_FACTOR", "MAX_EXTENSIONS", "MAX_REQUESTS", "Sweep", "Sweeper", "figures_at",
           "locate", "rescale", "sweep_growing", "sweep_once"]

"""The goodput search of one started configuration: the most load whose P95 TTFT meets
the target, found in a few replays.

From the top (max-num-seqs x replicas, capped by the KV cache and the workload; or a
predicted load) down or up, then between the last passing and failing loads at the
crossing of a monotone fit of every completed point (:func:`monotone_crossing`), until
the two are within :func:`edge_width` or ``max_replays`` are spent. A replay stops early
once more than 5 % of its requests are over the target (P95 cannot recover) or more than
1 % have failed (``MAX_ERROR_RATE``); that load point fails. Refining stops once even
the failing load could not beat the incumbent (Little's law bound). A contender that
holds at its cap is tried above it: queued requests may still meet the target.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.core.errors import Disrupted
from tuner.runtime.interrupts import current_deadline
from tuner.serving.config import ServeConfig
from tuner.serving.load import Concurrency, Load, Poisson, TraceReplay
from tuner.serving.result import describe_errors
from tuner.serving.slo import MAX_ERROR_RATE, monotone_crossing

if TYPE_CHECKING:
    from tuner.runtime.control import RunControl, StopHook
    from tuner.search.context import TrialContext
    from tuner.serving.result import RunResult
    from tuner.traffic.workload import Workload

#: A load point whose replay has more than this share of all requests over the target fails.
EARLY_STOP_SHARE = 0.05


#: From a passing predicted load with no failing one above, the next load tried (x).
STEP_UP = 1.15


#: A passing predicted load is not refined when the prediction x this stays below the
#: study's best (the configuration is not expected to come near it).
EXPECTED_SLACK = 1.1


#: The edge is located when a passing and a failing load are this share apart (closed
#: loop: and at least one user); ``--edge-tolerance``.
EDGE_TOLERANCE = 0.05


#: Replays a trial may use to find its edge (fewer when it is located sooner).
MAX_REPLAYS = 5

#: On the closed loop, the next load between a passing and a failing one is the fitted
#: crossing kept at least this share of the gap from either end (elsewhere a quarter).
#: With replays stopped early in the fit (:func:`goodput_search`), the default replays put
#: the top 20 configurations of four scenario families at 92.6-99.6 % (mean) of their
#: tokens/s at the edge located to 1 %, against 90.6-95.4 % with those replays left out
#: and a quarter of the gap (no noise; V100 with vLLM 0.6.3: worst 96 % instead of 79 %;
#: benchmarks/search_noise.py's families).
FIT_MARGIN = 0.1


def slo_stop_hook(target_ttft_s: float, total: int, share: float = EARLY_STOP_SHARE) -> StopHook:
    """Stop hook: True once more than ``share`` of ``total`` requests had TTFT over the
    target — P95 is then over the target whatever the rest do."""
    allowed = math.floor(share * total)
    seen = 0
    over = 0

    def stop(control: RunControl) -> bool:
        nonlocal seen, over
        ttfts = control.ttft_s
        for t in ttfts[seen:]:
            if t > target_ttft_s:
                over += 1
        seen = len(ttfts)
        return over > allowed

    return stop


def error_stop_hook(total: int, share: float = MAX_ERROR_RATE) -> StopHook:
    """Stop hook: True once more than ``share`` of ``total`` requests have failed — the
    load point fails whatever the rest do (a hung or refusing server costs one burst of
    timeouts or errors, not the whole workload)."""
    allowed = math.floor(share * total)

    def stop(control: RunControl) -> bool:
        return control.finished - len(control.ttft_s) > allowed

    return stop


@dataclass(slots=True)
class LoadPoint:
    level: float
    load: Load
    result: RunResult
    summary: dict[str, float]
    passed: bool
    severity: float = math.nan  #: the SLO set's largest measured / bound (<= 1 meets every SLO)
    binding: str = ""  #: the SLO with the smallest margin there (``p95:ttft<=2s``)

    @property
    def p95(self) -> float:
        """P95 TTFT; for a replay stopped early, that of the requests finished so far: a
        lower bound of the full replay's, already over the target."""
        p = self.summary.get("ttft_p95_s", math.nan)
        return p if math.isfinite(p) else math.inf

    @property
    def errors(self) -> dict[str, int]:
        """Failed requests per kind (requests a stopped replay never finished left out)."""
        return self.result.error_counts()

    @property
    def failed_by_errors(self) -> bool:
        """More than ``MAX_ERROR_RATE`` of the requests offered failed."""
        return sum(self.errors.values()) > MAX_ERROR_RATE * len(self.result)

    def error_reason(self) -> str:
        """``400 of 400 requests failed at 64 users: http_429 x400 (first http_429: 'rate
        limit reached'); at most 1% may fail`` (for a replay stopped by its failures: of the
        first requests answered, and that it stopped)."""
        errors = self.errors
        failed = sum(errors.values())
        top = next(iter(errors), None)
        detail = self.result.error_detail.get(top) if top else None
        kinds = describe_errors(errors) + (f" (first {top}: {detail[:100]!r})" if detail else "")
        n = len(self.result)
        answered = failed + int(self.result.ok.sum())
        if self.result.stopped_early and answered < n:
            which = (f"the first {answered} {'request' if answered == 1 else 'requests'} answered"
                     if failed == answered else f"{failed} of the first {answered} requests answered")
            return (f"{which} failed at {self.load.label}: {kinds}; more than {MAX_ERROR_RATE:.0%} of all {n} had "
                    "failed, so the replay stopped")
        return f"{failed} of {n} requests failed at {self.load.label}: {kinds}; at most {MAX_ERROR_RATE:.0%} may fail"


def load_for(kind: str, level: float, workload: Workload, seed: int = 0) -> Load:
    """The load at ``level`` on the axis ``kind``: users, requests/s, or trace multiplier."""
    if kind == "concurrency":
        return Concurrency(max(1, int(round(level))))
    if kind == "rate":
        return Poisson(rate=level, seed=seed)
    return TraceReplay(multiplier=level)


def max_users(facts: dict[str, Any], info: dict[str, Any], config: ServeConfig, workload: Workload) -> int:
    """The most closed-loop users a configuration can usefully hold: max-num-seqs per
    replica x replicas, capped by what the KV cache holds for this workload's mean request
    (prompt + half its output in flight) and by half the workload (so that a replay
    is more than one burst)."""
    replicas = config.replicas
    seqs = facts.get("max_num_seqs") or info.get("max_num_seqs") or config.max_num_seqs or 256
    users = int(seqs) * replicas
    kv_tokens = info.get("kv_cache_tokens") or facts.get("kv_cache_tokens")
    if kv_tokens and len(workload):
        mean_tokens = float(workload.prompt_tokens.mean() + workload.output_tokens.mean() / 2)
        users = min(users, max(1, int(kv_tokens * replicas / max(mean_tokens, 1.0))))
    return max(1, min(users, max(1, len(workload) // 2)))


def edge_width(level: float, load_kind: str, tolerance: float = EDGE_TOLERANCE) -> float:
    """How close a passing and a failing load must be for the edge to count as located:
    ``tolerance`` of the passing load, and at least one user on the closed loop."""
    width = tolerance * level
    return max(1.0, width) if load_kind == "concurrency" else width


def goodput_search(instance: Any, ctx: TrialContext, *, top: int, incumbent: float | None = None,
                   start: float | None = None, expected: float | None = None, ceiling: int | None = None,
                   itl_tail_s: float | None = None) -> list[LoadPoint]:
    """The load points measured on ``instance`` to find the most load that meets ``ctx.slo``
    (offered as ``ctx.load_kind``, at most ``ctx.settings.max_replays``): from the top (or a
    predicted ``start``), down or up, then between the last passing and failing loads at the
    crossing of a monotone fit of every point, until the two are within :func:`edge_width`
    or the replays are spent. On the closed loop a configuration that still meets the target
    at ``top`` (max-num-seqs x replicas, what its KV cache holds) is tried above it, up to
    ``ceiling`` users: queued requests may still meet the target, and that is the edge
    ``tuner plan`` finds. A replay every stream of which stalled at once for longer than the
    serving pauses (``itl_tail_s``: the study's inter-token tail;
    :func:`tuner.replay.disruption.disruption`) measured nothing: :class:`~tuner.core.errors.Disrupted`
    is raised."""
    return EdgeSearch(instance, ctx, incumbent=incumbent, expected=expected, itl_tail_s=itl_tail_s).search(
        top, start, ceiling)


class EdgeSearch:
    """One configuration's goodput search (:func:`goodput_search`): its load points so far,
    the last passing (``good``) and failing (``bad``) ones, and the axis's bounds."""

    def __init__(self, instance: Any, ctx: TrialContext, *, incumbent: float | None, expected: float | None,
                 itl_tail_s: float | None) -> None:
        s = ctx.settings
        self.instance, self.workload, self.slo, self.load_kind = instance, ctx.workload, ctx.slo, ctx.load_kind
        self.early_stop, self.seed, self.max_replays, self.tolerance = s.early_stop, s.seed, s.max_replays, \
            s.edge_tolerance
        self.obs, self.incumbent, self.expected, self.itl_tail_s = ctx.obs, incumbent, expected, itl_tail_s
        self.closed = ctx.load_kind == "concurrency"
        # the TTFT SLOs stop a replay early: over the bound for more than (100 - percentile) % of
        # all requests, the percentile cannot recover (P95: 5 %, EARLY_STOP_SHARE)
        self.ttft_bounds = [(x.bound_s, (100 - x.percentile) / 100) for x in ctx.slo.slos if x.metric == "ttft"]
        self.deadline = current_deadline()
        self.points: list[LoadPoint] = []
        self.good: LoadPoint | None = None
        self.bad: LoadPoint | None = None

    def run(self, level: float, kind: str) -> LoadPoint:
        """One replay at ``level`` on the axis ``kind``, as a load point."""
        workload, deadline = self.workload, self.deadline
        load = load_for(kind, level, workload, self.seed)
        self.obs.on_phase(f"replay {len(self.points) + 1}/{self.max_replays} at {load.label}")
        deadline.check()
        # The closed-loop run that calibrates an open-loop axis measures the rate served flat out: an SLO
        # stop would end it while the queue fills, at a fraction of that rate (a 14B model on an H100,
        # 162 users: stopped after 13.6 s at 1.9 req/s, where 10 req/s are served), and cap the axis there.
        slo_hooks = self.early_stop and kind == self.load_kind
        hooks = [slo_stop_hook(b, len(workload), share) for b, share in self.ttft_bounds] if slo_hooks else []
        errs = error_stop_hook(len(workload)) if self.early_stop else None

        def stop(c: RunControl) -> bool:
            return deadline.passed() or bool(errs and errs(c)) or any(h(c) for h in hooks)

        result = self.instance.run(workload, load, stop=stop if self.early_stop or deadline.at is not None else None)
        deadline.check()  # a replay cut by --timeout measured nothing: the trial is interrupted
        if result.stall_s:  # a streaming replay: was it disrupted?
            from tuner.replay.disruption import disruption

            if (why := disruption(result, self.itl_tail_s)) is not None:
                raise Disrupted(f"the replay at {load.label}: {why}")
        summary = {**result.summary(), "goodput_requests_per_s": self.slo.goodput(result)}
        ok = kind == self.load_kind and not result.stopped_early and self.slo.meets(summary)
        point = LoadPoint(level if kind == self.load_kind else math.inf, load, result, summary, ok,
                          self.slo.ratio(summary), self.slo.binding(summary).text)
        self.points.append(point)
        return point

    def search(self, top: int, start: float | None, ceiling: int | None) -> list[LoadPoint]:
        """Every load point measured, from the first (the top, or ``start``) to the edge."""
        hi_level, floor_level = float(top), 1.0
        if not self.closed:
            # Calibrate the open-loop axis with one closed-loop run at the most users: its
            # request rate is what the configuration serves flat out.
            sat = self.run(top, "concurrency")
            rate = sat.summary.get("requests_per_s") or 0.0
            if not rate > 0:
                return self.points
            base = 1.0 if self.load_kind == "rate" else max(len(self.workload) / max(self.workload.span_s, 1e-9),
                                                            1e-9)
            hi_level = 0.95 * rate / base
            floor_level = hi_level / 64
            self.max_replays -= 1  # the calibrating run was one of them
            start = None  # a predicted start is in users; this axis is only known now
        self.beyond = float(ceiling) if self.closed and ceiling and ceiling > hi_level else None
        self.hi_level, self.floor_level, self.start = hi_level, floor_level, start
        first_level = min(hi_level, max(start, floor_level)) if start and self.closed else hi_level
        if self.closed:
            first_level = float(max(1, round(first_level)))
        self.record(self.run(first_level, self.load_kind))
        for _ in range(self.max_replays - 1):
            level = self.next_level()
            if level is None:
                break
            self.record(self.run(level, self.load_kind))
        return self.points

    def record(self, point: LoadPoint) -> None:
        if point.passed:
            self.good = point
        else:
            self.bad = point

    def contender(self, p: LoadPoint, level: float) -> bool:
        """Could a passing point at ``level`` (closed loop: tokens/s grows at most in
        proportion to users, Little's law) come within reach of the incumbent?"""
        return not (self.incumbent and self.closed
                    and p.summary["tokens_per_s"] * level / p.level < self.incumbent)

    def next_level(self) -> float | None:
        """The next load to replay, or ``None`` when the edge is found (or cannot matter)."""
        good, bad = self.good, self.bad
        if good is not None and good.level >= self.hi_level:
            # holds at the top: above it only queueing grows; look for the edge there
            # only for a configuration that competes for the best
            if self.beyond is None or bad is not None or not self.contender(good, good.level):
                return None
            self.hi_level, self.beyond = self.beyond, None
        if good is None:
            level = self._below(bad)
        elif bad is None:
            level = self._above(good)
        else:
            level = self._between(good, bad)
        if level is None:
            return None
        if self.closed:
            level = float(max(1, round(level)))
            if good is not None and level <= good.level:
                level = good.level + 1
            if level in {p.level for p in self.points} or level > self.hi_level:
                return None
        return max(level, self.floor_level)

    def _below(self, bad: LoadPoint | None) -> float | None:
        """Nothing passed yet: a step down from the failing load."""
        assert bad is not None
        if bad.level <= self.floor_level:
            return None
        ratio = 1 / bad.severity if math.isfinite(bad.severity) and bad.severity > 0 else 0.25
        # from the top, a large step down; from a predicted load, a small one unless the
        # P95 measured there says the prediction was far off
        return bad.level * min(max(ratio * 0.9, 0.1), 1 / STEP_UP if self.start else 0.7)

    def _above(self, good: LoadPoint) -> float | None:
        """Passing below the most it may hold: step up, unless the prediction says this
        configuration cannot come near the incumbent."""
        if self.incumbent and self.expected is not None and self.expected * EXPECTED_SLACK < self.incumbent:
            return None
        if not self.contender(good, self.hi_level):
            return None
        return min(self.hi_level, good.level * STEP_UP)

    def _between(self, good: LoadPoint, bad: LoadPoint) -> float | None:
        """Between a passing and a failing load: the fitted crossing, kept off either end."""
        if bad.level - good.level <= edge_width(good.level, self.load_kind, self.tolerance):
            return None  # located
        # No load below the failing one beats good's tokens/s x bad.level / good.level:
        # below the incumbent, stop refining.
        if not self.contender(good, bad.level):
            return None
        # A replay stopped early knows only a lower bound of its P95. On the closed loop
        # it stays in the fit: with it the fit has two points from the first pass and
        # fail on, and a bound far over the target (a load past a cliff) points near the
        # edge. A bound just over the target pulls the crossing next to the failing load:
        # after two failing loads in a row the next one is the middle of the gap.
        points, closed = self.points, self.closed
        fitted = monotone_crossing([(p.level, p.severity) for p in points
                                    if p.level != math.inf and (closed or not p.result.stopped_early)],
                                   1.0, good.level, bad.level)
        if closed and not points[-1].passed and not points[-2].passed:
            fitted = None
        level = fitted if fitted is not None else (good.level + bad.level) / 2
        margin = (FIT_MARGIN if closed else 0.25) * (bad.level - good.level)
        return min(max(level, good.level + margin), bad.level - margin)

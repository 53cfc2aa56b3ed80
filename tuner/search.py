"""The search: an Optuna study whose objective is a configuration's *goodput* — the
token throughput (prompt + output tokens/s) at the highest load whose P95 TTFT meets
the target.

Per trial (:func:`evaluate_config`):

1. **Pre-check.** ``backend.precheck`` (the simulator's memory planner, for every
   backend) — a configuration vLLM would refuse is recorded as infeasible with vLLM's
   reason and costs no launch.
2. **Start** the deployment (a refused start is recorded the same way).
3. **Goodput search** over the load (closed-loop users, a Poisson rate, or the trace's
   rate multiplier), at most ``max_replays`` replays: the first at the most load the
   configuration can hold (max-num-seqs x replicas, capped by its KV cache and the
   workload size); on a miss, the next load is interpolated from the P95 TTFT measured,
   then bisected. A replay stops early once more than 5% of all its requests have already
   exceeded the target (P95 cannot recover), or once more than 1% of them have failed
   (``MAX_ERROR_RATE``: an HTTP error, a timeout, a broken or short stream); that load
   point fails. If every load point fails, the trial is infeasible, with the evidence
   stored; when errors failed the lowest load, the reason names them (``400 of 400
   requests failed at 64 users: http_429 x400``), never a latency. Refining also stops
   once even the failing load could not beat the study's best trial (Little's law bound).

The P95 TTFT constraint goes to the sampler as an Optuna constraint
(``trial.set_constraint``, which replaced ``constraints_func`` in Optuna 5.0; TPE and GP
both read it), so it learns the feasible region. Infeasible
configurations are COMPLETE trials with value 0 and a positive constraint; a backend
crash marks only that trial FAIL and the study goes on. A configuration the sampler
proposes again is not relaunched: the trial copies the earlier result (``repeat_of``).
A new TPE/GP study first runs vLLM's defaults at each layout (:func:`default_trials`).

Stored per trial (``trial.user_attrs``): ``config``, ``feasible``, ``constraint``,
``tokens_per_s``, ``output_tokens_per_s``, ``summary`` (every percentile of the chosen
load point), ``server`` (server readings), ``loads`` (every load point tried, each with
its ``errors``), ``errors`` (failed requests per kind at the chosen load, or at the
lowest load when infeasible; ``error_detail`` the first message of each kind),
``failed_by`` (``errors`` or ``latency``, for an infeasible trial that ran),
``infeasible_reason``, ``gpu_s`` (startup + replay seconds; simulated for the
simulator), ``run`` (workload fingerprint, backend, vLLM version, hardware, seed,
sampler, log paths, plan facts).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.config import Deployment, ServeConfig
from tuner.errors import ConfigRejected, EnvironmentFault, InputError
from tuner.interrupts import Deadline, Interrupted, current_deadline, deadline_scope
from tuner.load import Concurrency, Load, Poisson, TraceReplay
from tuner.result import describe_errors
from tuner.study import (
    count_finished,
    guard_storage,
    open_study,
    study_name,
    top_feasible_trials,
)
from tuner.urls import redact, redact_value

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.backends.base import Backend, RunControl
    from tuner.predictor import Advice, Predictor
    from tuner.result import RunResult
    from tuner.space import SearchSpace, WorkloadSpec
    from tuner.traffic.workload import Workload

SAMPLERS = ("tpe", "gp", "random", "grid")
#: Trials before TPE/GP model the space (vLLM's defaults per layout count among them).
#: 5 beat 3, 4 and 8 at 15 trials on benchmarks/search_quality.py's seeds 10-39; the
#: benchmark reports seeds 0-9.
N_STARTUP_TRIALS = 5
#: Name of the trial constraint: P95 TTFT / target - 1 (<= 0 feasible; 1.0 for refusals).
CONSTRAINT = "p95_ttft_over_target"
#: A load point whose replay has more than this share of all requests over the target fails.
EARLY_STOP_SHARE = 0.05
#: Share of failed requests a load point tolerates (more: the replay stops, the point fails).
MAX_ERROR_RATE = 0.01
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
#: Repeat measurements per candidate when confirming a study's winner (``--confirm``).
CONFIRM_ROUNDS = 2
#: Backends whose trials cost GPU time: ``run_search(predictor="auto")`` predicts for them.
PREDICTED_BACKENDS = ("vllm",)


# -- progress --------------------------------------------------------------------------
class SearchObserver:
    """Progress hooks; the default does nothing (headless)."""

    def on_start(self, name: str, finished: int, budget: int) -> None: ...

    def on_phase(self, text: str) -> None: ...

    def on_trial(self, trial: FrozenTrial, best: FrozenTrial | None, finished: int) -> None: ...

    def on_warning(self, text: str) -> None: ...


# -- one configuration -----------------------------------------------------------------
@dataclass(slots=True)
class Evaluation:
    """What one configuration scored. ``value`` is tokens/s at the chosen load (0 when
    infeasible); ``constraint`` is P95 TTFT / target − 1 at that load (> 0 infeasible)."""

    feasible: bool
    value: float
    constraint: float
    attrs: dict[str, Any] = field(default_factory=dict)
    gpu_s: float = 0.0


def slo_stop_hook(target_ttft_s: float, total: int, share: float = EARLY_STOP_SHARE) -> Callable[[RunControl], bool]:
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


def error_stop_hook(total: int, share: float = MAX_ERROR_RATE) -> Callable[[RunControl], bool]:
    """Stop hook: True once more than ``share`` of ``total`` requests have failed — the
    load point fails whatever the rest do (a hung or refusing server costs one burst of
    timeouts or errors, not the whole workload)."""
    allowed = math.floor(share * total)

    def stop(control: RunControl) -> bool:
        return control.finished - len(control.ttft_s) > allowed

    return stop


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, numpy scalars → Python."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


@dataclass(slots=True)
class _Point:
    level: float
    load: Load
    result: RunResult
    summary: dict[str, float]
    passed: bool

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


def evaluate_config(
    backend: Backend,
    deployment: Deployment,
    config: ServeConfig,
    workload: Workload,
    target_ttft_s: float,
    *,
    load_kind: str = "concurrency",
    max_replays: int = MAX_REPLAYS,
    precheck: bool = True,
    early_stop: bool = True,
    seed: int = 0,
    phase: Callable[[str], None] | None = None,
    incumbent: float | None = None,
    start_level: float | None = None,
    expected_value: float | None = None,
    edge_tolerance: float = EDGE_TOLERANCE,
) -> Evaluation:
    """Score one configuration (see the module docstring). Raises only for backend
    crashes (:class:`~tuner.errors.BackendError` and the like); refusals are results.

    ``incumbent`` is the best value the study has so far: once a passing load is found,
    refining stops when even the failing load above it could not beat the incumbent.
    ``start_level`` (a predicted load, :mod:`tuner.predictor`) is the first load tried
    instead of the most the configuration holds; ``expected_value`` (the predicted
    tokens/s) stops refining a passing load of a configuration not expected to come
    within reach of the incumbent."""
    say = phase or (lambda text: None)
    attrs: dict[str, Any] = {"config": config.to_dict(), "target_ttft_s": target_ttft_s}
    facts: dict[str, Any] = {}
    launched = 0.0
    try:
        if precheck:
            say("pre-check")
            facts = planner_precheck(deployment, config) if backend.name != "sim" else {}
            facts.update(backend.precheck(deployment, config) or {})
            attrs["plan"] = _clean(facts)
        say("starting")
        launched = time.perf_counter()
        instance = backend.start(deployment, config)
    except ConfigRejected as err:
        # a real refused start cost its wall time on the GPUs; the simulator's costs nothing
        spent = time.perf_counter() - launched if launched and backend.name != "sim" else 0.0
        return _rejected(attrs, err, launched=bool(launched), gpu_s=spent)
    info = dict(getattr(instance, "info", {}) or {})
    startup_s = float(info.get("startup_s") or 0.0)
    attrs["startup_s"] = startup_s
    attrs["log_paths"] = _clean(info.get("log_paths") or [])
    attrs["vllm_version"] = info.get("vllm_version") or deployment.vllm_version
    points: list[_Point] = []
    try:
        with instance:
            points = _goodput_search(
                instance, workload, target_ttft_s, load_kind=load_kind, max_replays=max_replays,
                early_stop=early_stop, seed=seed, say=say,
                top=max_users(facts, info, config, workload), incumbent=incumbent,
                start=start_level, expected=expected_value, tolerance=edge_tolerance,
                ceiling=max(1, len(workload) // 2),
            )
    except ConfigRejected as err:  # e.g. a request the max-model-len cannot hold
        return _rejected(attrs, err, launched=True, gpu_s=startup_s)
    replay_s = sum(p.result.duration_s for p in points)
    gpu_s = startup_s + replay_s
    attrs["gpu_s"] = gpu_s
    attrs["loads"] = [
        _clean({"load": p.load.label, "level": p.level, "p95_ttft_s": p.summary.get("ttft_p95_s"),
                "tokens_per_s": p.summary.get("tokens_per_s"), "error_rate": p.summary.get("error_rate"),
                "errors": p.errors, "duration_s": p.result.duration_s, "stopped_early": p.result.stopped_early,
                "passed": p.passed})
        for p in points
    ]
    passed = [p for p in points if p.passed]
    lowest = min(points, key=lambda p: p.level)
    attrs["p95_ttft_at_lowest_load_s"] = _clean(lowest.summary.get("ttft_p95_s"))
    attrs["lowest_load"] = lowest.load.label
    if not passed:
        over = lowest.p95 if math.isfinite(lowest.p95) else 2 * target_ttft_s
        constraint = over / target_ttft_s - 1.0
        if lowest.failed_by_errors:
            # errors failed the load, whatever its P95 (that of the few requests served)
            reason = lowest.error_reason()
            if math.isfinite(lowest.p95) and lowest.p95 > target_ttft_s:
                reason += f"; P95 TTFT {lowest.p95:.3g} s over the {target_ttft_s:g} s target too"
            constraint = max(constraint, 1.0)
        elif math.isfinite(lowest.p95):
            reason = (f"P95 TTFT {lowest.p95:.3g} s over the {target_ttft_s:g} s target even at {lowest.load.label}"
                      + (" (replay stopped early: >5% of requests already over)" if lowest.result.stopped_early
                         else ""))
        else:
            reason = f"no request completed at {lowest.load.label}"
        attrs.update(
            feasible=False, constraint=constraint, infeasible_reason=reason,
            failed_by="errors" if lowest.failed_by_errors else "latency",
            summary=_clean(lowest.summary), server=_clean(redact_value(lowest.result.server)),
            tokens_per_s=0.0, output_tokens_per_s=0.0, **_error_attrs(lowest),
        )
        return Evaluation(False, 0.0, attrs["constraint"], attrs, gpu_s)
    best = max(passed, key=lambda p: p.level)
    above = [p for p in points if not p.passed and p.level > best.level and p.level != math.inf]
    failing = min(above, key=lambda p: p.level) if above else None
    cap = max_users(facts, info, config, workload)
    attrs["edge"] = _clean({
        "level": best.level, "failing_level": failing.level if failing else None,
        "located": failing is not None and failing.level - best.level <= edge_width(best.level, load_kind, edge_tolerance),
        "tolerance": edge_tolerance, "cap": cap if load_kind == "concurrency" else None,
        "beyond_cap": load_kind == "concurrency" and best.level > cap,
    })
    s = best.summary
    attrs.update(
        feasible=True,
        constraint=s["ttft_p95_s"] / target_ttft_s - 1.0,
        summary=_clean(s), server=_clean(redact_value(best.result.server)),
        tokens_per_s=float(s["tokens_per_s"]), output_tokens_per_s=float(s["output_tokens_per_s"]),
        error_rate=float(s["error_rate"]), chosen_load=best.load.label, **_error_attrs(best),
    )
    return Evaluation(True, float(s["tokens_per_s"]), attrs["constraint"], attrs, gpu_s)


def _error_attrs(point: _Point) -> dict[str, Any]:
    """``errors`` (kind -> count) of a load point, and ``error_detail`` when any failed."""
    errors = point.errors
    out: dict[str, Any] = {"errors": errors}
    if errors:
        out["error_detail"] = {k: redact(v)[:300] for k, v in point.result.error_detail.items() if k in errors}
    return out


def planner_precheck(deployment: Deployment, config: ServeConfig) -> dict[str, Any]:
    """The simulator's memory plan, as a pre-check before a real backend starts anything:
    raises ConfigRejected where vLLM would refuse. A deployment the simulator cannot
    model (a GPU or model it does not know) is not pre-checked: ``{}``."""
    from tuner.backends.sim import SimBackend

    try:
        return SimBackend().precheck(deployment, config)
    except InputError:
        return {}


def default_trials(space: SearchSpace) -> list[dict[str, Any]]:
    """Trial params of vLLM's own defaults at each layout of the space (knobs left unset,
    resolved by the memory planner for this GPU and vLLM version, then snapped to the
    nearest value the space allows). A new TPE/GP study runs these first: it always holds
    the out-of-the-box answer to compare with, and its model starts from a sound point in
    every layout, the knob that matters most."""
    from tuner.space import parse_layout

    out = []
    for layout in space.layout_choices:
        tp, replicas = parse_layout(layout)
        config = ServeConfig(tensor_parallel_size=tp, replicas=replicas, **dict(space.fixed))
        try:  # strict=False: the defaults resolve even where vLLM would refuse them
            from tuner.sim.memory import plan_memory

            facts = plan_memory(space.deployment, config, strict=False).summary()
        except (ConfigRejected, InputError):
            facts = {}
        params = {p.key: p.encode(p.nearest(facts.get(p.name, getattr(config, p.name)))) for p in space.params}
        if len(space.layout_choices) > 1:
            params["layout"] = layout
        params = _startable(space, params)
        if params not in out:
            out.append(params)
    return out


def _snapped_grid(space: SearchSpace) -> dict[str, list[Any]]:
    """``space.grid()`` with range values snapped onto their steps (valid trial params)."""
    grid = space.grid()
    for p in space.params:
        if p.key in grid:
            grid[p.key] = list(dict.fromkeys(p.encode(p.nearest(p.decode(v))) for v in grid[p.key]))
    return grid


def _startable(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` if vLLM would start them, else the same with the fewest knobs moved: one
    knob to the nearest of its grid values that the memory planner accepts (snapping vLLM's
    defaults into a space can make them refuse, e.g. max-num-batched-tokens below
    max-model-len without chunked prefill; a refused first trial would teach the sampler
    that the rest of it is infeasible). Unchanged when no single knob helps."""
    from tuner.sim.memory import plan_memory

    def starts(candidate: dict[str, Any]) -> bool:
        try:
            plan_memory(space.deployment, space.config_from_params(candidate))
        except (ConfigRejected, InputError):
            return False
        return True

    if starts(params):
        return params
    grid = _snapped_grid(space)
    for p in space.params:
        here = p.decode(params[p.key])
        values = list(grid.get(p.key, []))
        if isinstance(here, (int, float)) and not isinstance(here, bool):
            values.sort(key=lambda v: abs(float(p.decode(v)) - float(here)))
        for value in values:
            if value != params[p.key] and starts({**params, p.key: value}):
                return {**params, p.key: value}
    return params


def _rejected(attrs: dict[str, Any], err: ConfigRejected, *, launched: bool, gpu_s: float = 0.0) -> Evaluation:
    attrs.update(
        feasible=False, constraint=1.0, tokens_per_s=0.0, output_tokens_per_s=0.0,
        infeasible_reason=f"{err.kind}: {redact(err.message)}", rejected_kind=err.kind,
        rejected_at="start" if launched else "pre-check", gpu_s=gpu_s,
    )
    if err.log_path:
        attrs["log_paths"] = [err.log_path]
    return Evaluation(False, 0.0, 1.0, attrs, gpu_s)


def edge_width(level: float, load_kind: str, tolerance: float = EDGE_TOLERANCE) -> float:
    """How close a passing and a failing load must be for the edge to count as located:
    ``tolerance`` of the passing load, and at least one user on the closed loop."""
    width = tolerance * level
    return max(1.0, width) if load_kind == "concurrency" else width


def monotone_crossing(points: Sequence[tuple[float, float]], target: float, lo: float, hi: float) -> float | None:
    """Where a monotone fit through every measured ``(load, P95 TTFT)`` crosses ``target``
    between ``lo`` (passes) and ``hi`` (fails): P95 made non-decreasing in load (running
    maximum, a lower bound for replays stopped early), then a shape-preserving PCHIP
    through it (scipy), as ``tuner plan`` does. None when the fit cannot place it."""
    from scipy.interpolate import PchipInterpolator
    from scipy.optimize import brentq

    pts = sorted((x, y) for x, y in points if math.isfinite(x) and math.isfinite(y))
    xs: list[float] = []
    ys: list[float] = []
    for x, y in pts:
        y = max(y, ys[-1]) if ys else y
        if xs and x == xs[-1]:
            ys[-1] = max(ys[-1], y)
            continue
        xs.append(x)
        ys.append(y)
    if len(xs) < 2 or not (lo < hi):
        return None
    f = PchipInterpolator(xs, ys, extrapolate=False)
    g = lambda x: float(f(x)) - target  # noqa: E731
    a, b = max(lo, xs[0]), min(hi, xs[-1])
    if not (a < b) or not (math.isfinite(g(a)) and math.isfinite(g(b))) or g(a) > 0 or g(b) <= 0:
        return None
    return float(brentq(g, a, b, xtol=1e-3))


def _goodput_search(
    instance: Any, workload: Workload, target: float, *, load_kind: str, max_replays: int,
    early_stop: bool, seed: int, say: Callable[[str], None], top: int, incumbent: float | None = None,
    start: float | None = None, expected: float | None = None, tolerance: float = EDGE_TOLERANCE,
    ceiling: int | None = None,
) -> list[_Point]:
    """The load points measured to find the most load that meets ``target``: from the
    top (or a predicted ``start``), down or up, then between the last passing and
    failing loads at the crossing of a monotone fit of every point, until the two are
    within :func:`edge_width` or ``max_replays`` are spent. On the closed loop a
    configuration that still meets the target at ``top`` (max-num-seqs x replicas, what
    its KV cache holds) is tried above it, up to ``ceiling`` users: queued requests may
    still meet the target, and that is the edge ``tuner plan`` finds."""
    points: list[_Point] = []

    deadline = current_deadline()

    def run(level: float, kind: str) -> _Point:
        load = load_for(kind, level, workload, seed)
        say(f"replay {len(points) + 1}/{max_replays} at {load.label}")
        deadline.check()
        slo = slo_stop_hook(target, len(workload)) if early_stop else None
        errs = error_stop_hook(len(workload)) if early_stop else None

        def stop(c: RunControl) -> bool:
            return deadline.passed() or bool(errs and errs(c)) or bool(slo and slo(c))

        result = instance.run(workload, load, stop=stop if early_stop or deadline.at is not None else None)
        deadline.check()  # a replay cut by --timeout measured nothing: the trial is interrupted
        summary = result.summary()
        p95 = summary.get("ttft_p95_s", math.nan)
        ok = (kind == load_kind and not result.stopped_early and math.isfinite(p95) and p95 <= target
              and summary.get("error_rate", 0.0) <= MAX_ERROR_RATE)
        point = _Point(level if kind == load_kind else math.inf, load, result, summary, ok)
        points.append(point)
        return point

    hi_level: float = float(top)
    floor_level = 1.0
    if load_kind != "concurrency":
        # Calibrate the open-loop axis with one closed-loop run at the most users: its
        # request rate is what the configuration serves flat out.
        sat = run(top, "concurrency")
        rate = sat.summary.get("requests_per_s") or 0.0
        if not rate > 0:
            return points
        base = 1.0 if load_kind == "rate" else max(len(workload) / max(workload.span_s, 1e-9), 1e-9)
        hi_level = 0.95 * rate / base
        floor_level = hi_level / 64
        max_replays -= 1
        start = None  # a predicted start is in users; this axis is only known now
    beyond = float(ceiling) if load_kind == "concurrency" and ceiling and ceiling > hi_level else None
    first_level = min(hi_level, max(start, floor_level)) if start and load_kind == "concurrency" else hi_level
    if load_kind == "concurrency":
        first_level = float(max(1, round(first_level)))
    first = run(first_level, load_kind)
    good: _Point | None = first if first.passed else None
    bad: _Point | None = None if first.passed else first

    def contender(p: _Point, level: float) -> bool:
        """Could a passing point at ``level`` (closed loop: tokens/s grows at most in
        proportion to users, Little's law) come within reach of the incumbent?"""
        return not (incumbent and load_kind == "concurrency"
                    and p.summary["tokens_per_s"] * level / p.level < incumbent)

    for _ in range(max_replays - 1):
        if good is not None and good.level >= hi_level:
            # holds at the top: above it only queueing grows; look for the edge there
            # only for a configuration that competes for the best
            if beyond is None or bad is not None or not contender(good, good.level):
                break
            hi_level, beyond = beyond, None
        if good is None:
            assert bad is not None
            if bad.level <= floor_level:
                break
            ratio = target / bad.p95 if math.isfinite(bad.p95) and bad.p95 > 0 else 0.25
            # from the top, a large step down; from a predicted load, a small one unless the
            # P95 measured there says the prediction was far off
            level = bad.level * min(max(ratio * 0.9, 0.1), 1 / STEP_UP if start else 0.7)
        elif bad is None:
            # passing below the most it may hold: step up, unless the prediction says this
            # configuration cannot come near the incumbent
            if incumbent and expected is not None and expected * EXPECTED_SLACK < incumbent:
                break
            if not contender(good, hi_level):
                break
            level = min(hi_level, good.level * STEP_UP)
        else:
            if bad.level - good.level <= edge_width(good.level, load_kind, tolerance):
                break  # located
            # No load below the failing one beats good's tokens/s x bad.level / good.level:
            # below the incumbent, stop refining.
            if not contender(good, bad.level):
                break
            # a replay stopped early knows only a lower bound of its P95: left out of the fit
            fitted = monotone_crossing([(p.level, p.p95) for p in points
                                        if p.level != math.inf and not p.result.stopped_early],
                                       target, good.level, bad.level)
            level = fitted if fitted is not None else (good.level + bad.level) / 2
            level = min(max(level, good.level + 0.25 * (bad.level - good.level)),
                        good.level + 0.75 * (bad.level - good.level))
        if load_kind == "concurrency":
            level = float(max(1, round(level)))
            if good is not None and level <= good.level:
                level = good.level + 1
            if level in {p.level for p in points} or level > hi_level:
                break
        level = max(level, floor_level)
        point = run(level, load_kind)
        if point.passed:
            good = point
        else:
            bad = point
    return points


# -- the study ---------------------------------------------------------------------------
def _workload_file(space: SearchSpace, workload: Workload) -> str | None:
    """The file the study's requests were read from (absolute; a converted trace is its
    own source, never the log named inside it); None for a built-in mix or requests
    given in memory."""
    source = Path(str(workload.source or ""))
    return str(source.resolve()) if str(source) and source.is_file() else None


def workload_facts(workload: Workload) -> dict[str, Any]:
    """What decides whether a knob can matter for this workload: the longest request
    (prompt + output tokens) and whether requests share prefixes (repeated prefix hash ids,
    or conversations of more than one turn)."""
    longest = int((workload.prompt_tokens + workload.output_tokens).max()) if len(workload) else 0
    shares = False
    if workload.hash_ids is not None:
        seen: set[int] = set()
        for ids in workload.hash_ids:
            if ids and ids[0] in seen:
                shares = True
                break
            seen.update(ids[:1])
    if not shares and workload.turn is not None and len(workload.turn):
        shares = bool((workload.turn > 0).any())
    return {"workload_longest_tokens": longest, "workload_shares_prefixes": shares}


def make_sampler(name: str, *, seed: int | None, space: SearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """TPE with constraints (default), GP with constraints, random, or grid over the
    space's discretised version."""
    import optuna

    name = name.lower()
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=N_STARTUP_TRIALS)
    if name == "gp":
        try:
            import torch  # noqa: F401  (GPSampler's dependency)
        except ImportError as err:
            raise InputError("the GP sampler needs PyTorch", hint="pip install torch, or use --sampler tpe") from err
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=N_STARTUP_TRIALS)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if space is None:
            raise InputError("the grid sampler needs a search space")
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    raise InputError(f"unknown sampler {name!r}", hint=f"use one of {', '.join(SAMPLERS)}")


def get_backend_by_name(name: str, **options: Any) -> Backend:
    """``sim`` (default), ``vllm`` or ``endpoint`` (:func:`tuner.backends.get_backend`)."""
    from tuner.backends import get_backend

    return get_backend(name, **options)


def build_workload(spec: WorkloadSpec, deployment: Deployment | None = None) -> Workload:
    """The study's workload: the trace when given, else the built-in synthetic mix."""
    if spec.trace:
        from tuner.traffic import load_trace  # type: ignore[attr-defined]

        return load_trace(spec.trace)
    from tuner.traffic.synth import article_mix, default_workload

    if spec.load == "trace":  # the trace axis compresses logged times: give it Poisson arrivals
        return article_mix(spec.requests, rate=spec.rate, seed=spec.seed)
    return default_workload(seed=spec.seed, n=spec.requests)


def num_heads(deployment: Deployment) -> int:
    from tuner.sim.model import load_model

    return load_model(deployment.model).num_heads


@dataclass(slots=True)
class SearchOutcome:
    study: optuna.Study
    name: str
    storage: str | None
    best: FrozenTrial | None
    finished: int
    new_trials: int
    wall_s: float
    gpu_s: float  # startup + replay seconds of this session's trials
    notes: list[str] = field(default_factory=list)
    timed_out: bool = False
    confirmation: Any = None  # tuner.confirmation.Confirmation of the study's winner, when made


@guard_storage
def run_search(
    space: SearchSpace,
    *,
    backend: Backend | str = "sim",
    workload: Workload | None = None,
    budget: int = 40,
    timeout_s: float | None = None,
    storage: str | None = None,
    study: str | None = None,
    sampler: str = "tpe",
    seed: int = 0,
    enqueue: Sequence[ServeConfig] = (),
    precheck: bool = True,
    early_stop: bool = True,
    max_replays: int = MAX_REPLAYS,
    observer: SearchObserver | None = None,
    tags: dict[str, Any] | None = None,
    predictor: Predictor | str | None = "auto",
    kill_stale: bool = False,
    confirm: int = CONFIRM_ROUNDS,
    edge_tolerance: float = EDGE_TOLERANCE,
) -> SearchOutcome:
    """Run (or resume) the study for ``space`` until it holds ``budget`` finished trials
    or ``timeout_s`` passes. ``space`` must be bound (:meth:`SearchSpace.bind`); a
    ``precheck`` is always the simulator's memory planner when the backend has one.
    Several processes may run it on one server-database study (:mod:`tuner.workers`:
    the budget is global). ``tags`` are stamped on every new trial, and a configuration
    is only reused from a trial with the same tags and workload.

    ``predictor`` (:mod:`tuner.predictor`): ``"auto"`` uses the simulator for the vLLM
    backend when it can model the deployment (a trial then starts its goodput search at
    the predicted load, and a configuration predicted below ``PRUNE_SHARE`` of the best
    is pruned without a launch); ``None`` turns it off; or a :class:`Predictor`.

    Trials that measure nothing (:mod:`tuner.recovery`) — interrupted by a signal or by
    ``timeout_s`` (which also cuts a hung start or replay), or failed by the environment
    — do not use the budget and are queued again when the study resumes; two
    environment faults in a row stop the run (:class:`EnvironmentFault`). Servers a
    dead run left behind are reported through ``observer.on_warning`` and stopped only
    with ``kill_stale``.

    Every trial replays the same requests in the same order with the same arrival seed
    (common random numbers: differences between trials are the configurations', not the
    sample's). Once the budget is spent, the configurations within the noise band of the
    best are measured ``confirm`` more times each on new samples, and the study's
    recommendation is made on those repeats (:mod:`tuner.confirmation`); ``confirm=0``
    turns that off. ``edge_tolerance``: how close the passing and failing loads of a
    trial must come (share of the load, closed loop at least one user)."""

    import optuna

    from tuner.predictor import advise
    from tuner.recovery import requeue

    if budget < 1:
        raise InputError(f"--budget must be >= 1, got {budget}")
    obs = observer or SearchObserver()
    t0 = time.perf_counter()
    deployment = space.deployment
    backend_obj = get_backend_by_name(backend) if isinstance(backend, str) else backend
    _check_gpu(space, backend_obj, obs)
    preflight = getattr(backend_obj, "preflight", None)
    if preflight is not None:
        preflight(deployment)  # EnvironmentFault before any study or trial is written
    if workload is None:
        obs.on_phase("building workload")
        workload = build_workload(space.workload, deployment)
    fingerprint = workload.fingerprint()
    target = space.workload.target_ttft_s
    name = study or study_name(deployment, fingerprint, space.name, backend_obj.name, target)
    from tuner.workers import StudyLock, Worker, budget_used, worker_seed

    the_sampler = make_sampler(sampler, seed=worker_seed(seed, storage), space=space)
    st = open_study(name, storage, sampler=the_sampler)
    _stamp_study(st, space, deployment, fingerprint, backend_obj.name, sampler, seed, target)
    stamped = st.user_attrs.get("target_ttft_s")
    if stamped is not None and abs(float(stamped) - target) > 1e-9:
        raise InputError(
            f"study {name!r} was searched for P95 TTFT <= {float(stamped):g} s, not {target:g} s: "
            "its trials' feasibility would mix two targets",
            hint=f"resume it with --target-ttft {float(stamped):g}s, or give --study a new name",
        )
    _stale_servers(obs, kill_stale)
    finished = count_finished(st)
    obs.on_start(name, finished, budget)
    trials = st.get_trials(deepcopy=False)
    waiting = {tuple(sorted(t.params.items())) for t in trials}
    first = [(space.params_of(c), {"warm_start": True}) for c in enqueue]
    if not trials and sampler.lower() in ("tpe", "gp"):
        first += [(p, {"vllm_defaults": True}) for p in default_trials(space)]
    for params, attrs in first:
        if tuple(sorted(params.items())) not in waiting:
            waiting.add(tuple(sorted(params.items())))
            st.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)
    run_facts = _clean({
        "workload_fingerprint": fingerprint, "workload_source": workload.source,
        "workload_file": _workload_file(space, workload), "workload_requests": len(workload),
        **workload_facts(workload), "backend": backend_obj.name,
        "hardware": deployment.to_dict(), "seed": seed, "load_seed": seed, "sample": "as logged",
        "sampler": sampler, "space": space.name, "load_kind": space.workload.load,
    })
    session_gpu_s = 0.0
    if predictor == "auto":
        from tuner.predictor import sim_predictor

        predictor = (sim_predictor(deployment, workload, target, space.workload.load)
                     if backend_obj.name in PREDICTED_BACKENDS and precheck and early_stop else None)
    elif isinstance(predictor, str):
        raise InputError(f"unknown predictor {predictor!r}", hint="use 'auto', or none")

    def objective(trial: optuna.Trial) -> float:
        nonlocal session_gpu_s
        worker.started(trial)
        config = space.suggest(trial)
        worker.wait_for_twin(trial)
        earlier = _same_config(trial.study, config, fingerprint, tags or {})
        if earlier is not None:  # a sampler may propose a config again: reuse, do not relaunch
            obs.on_phase(f"same configuration as trial {earlier.number}")
            trial.set_constraint(CONSTRAINT, float(earlier.user_attrs.get("constraint", 1.0)))
            for key, value in earlier.user_attrs.items():
                if key not in ("warm_start", "vllm_defaults", "gpu_s"):
                    trial.set_user_attr(key, value)
            trial.set_user_attr("repeat_of", earlier.number)
            trial.set_user_attr("gpu_s", 0.0)
            return float(earlier.value)
        try:
            best = _best_value(trial.study)
            noise = study_noise(trial.study, backend_obj.name)
            advice = None
            if predictor is not None:
                obs.on_phase("predicting on the simulator")
                # a twin within the noise band of the best may be the best: it is measured
                advice = advise(trial.study.get_trials(deepcopy=False), config, predictor.predict(config), best,
                                twin_share=1 - noise.band())
                if advice.prune:
                    if advice.twin_of is not None:  # the sampler proposed nothing new: the predictor does
                        _propose(trial.study, space, predictor, best)
                    _prune(trial, config, advice, run_facts)
            ev = evaluate_config(
                backend_obj, deployment, config, workload, target,
                load_kind=space.workload.load, max_replays=max_replays,
                precheck=precheck, early_stop=early_stop, seed=seed, phase=obs.on_phase,
                # within the noise band of the best, a configuration is refined as a rival
                incumbent=best * (1 - noise.band()) if early_stop and best else None,
                start_level=advice.start_level if advice else None,
                expected_value=advice.expected_value if advice else None,
                edge_tolerance=edge_tolerance,
            )
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt as err:  # a signal, Ctrl-C or --timeout: nothing measured
            why = f"interrupted ({err.reason})" if isinstance(err, Interrupted) else "interrupted (Ctrl-C)"
            err.trial = trial.number  # type: ignore[attr-defined]  # for the CLI's one line
            _failed(trial, config, run_facts, "interrupted", why)
            raise
        except EnvironmentFault as err:  # the machine, not the configuration
            _failed(trial, config, run_facts, "environment", f"{err.kind}: {err.message}")
            raise
        except Exception as err:  # a crash fails this trial only; the study goes on
            _failed(trial, config, run_facts, "crash", f"{type(err).__name__}: {err}")
            raise
        session_gpu_s += ev.gpu_s
        attrs = dict(ev.attrs)
        run = dict(run_facts)
        for key in ("vllm_version", "log_paths", "startup_s", "plan"):
            if key in attrs:
                run[key] = attrs.pop(key)
        attrs["run"] = run
        if advice is not None and advice.prediction:
            attrs["prediction"] = advice.prediction
        trial.set_constraint(CONSTRAINT, ev.constraint)
        for key, value in attrs.items():
            trial.set_user_attr(key, _clean(value))
        return ev.value

    env_faults: list[str] = []
    notes: list[str] = []

    def after(st_: optuna.Study, trial: FrozenTrial) -> None:
        from tuner.study import best_feasible_trial

        if trial.user_attrs.get("fail_kind") == "environment":
            env_faults.append(str(trial.user_attrs.get("fail_reason")))
            obs.on_warning(f"trial {trial.number} failed by the environment, not counted: {env_faults[-1]}")
            if len(env_faults) >= ENVIRONMENT_FAULTS_TO_STOP:
                worker.halt = env_faults[-1]
                st_.stop()
        else:
            env_faults.clear()
            if trial.user_attrs.get("fail_kind") == "crash":
                obs.on_warning(f"trial {trial.number} failed: {trial.user_attrs.get('fail_reason')}")
        obs.on_trial(trial, best_feasible_trial(st_), count_finished(st_))

    interrupted: Interrupted | None = None
    with Worker(st, storage, budget=budget, timeout_s=timeout_s,
                gpus=deployment.gpu_ids or deployment.gpu_count, attrs=tags) as worker:
        for number in worker.leftovers:
            obs.on_warning(f"trial {number} was left RUNNING by a run that is gone: failed as interrupted "
                           "(not counted) and measured again")
        again = requeue(st)
        for g in again.given_up:
            notes.append(f"configuration {g['params']} failed {g['failures']} times without a measurement "
                         f"({'; '.join(str(r) for r in g['reasons'])[:300]}); not retried")
            obs.on_warning(notes[-1])
        try:
            with deadline_scope(Deadline(timeout_s)), _quiet_optuna():
                worker.optimize(objective, catch=(Exception,), callbacks=[after])
                used, running = budget_used(st, shared=worker.shared)
                if confirm > 0 and worker.halt is None and used >= budget and not running:
                    # one worker confirms; the others leave it to them (their outcome has none yet)
                    lock = StudyLock(worker.url, st.study_name, "confirm") if worker.shared else None
                    try:
                        if lock is None or lock.acquire(blocking=False):
                            confirm_winner(
                                st, backend_obj, deployment, workload, target, rounds=confirm, seed=seed,
                                load_kind=space.workload.load, max_replays=max_replays, precheck=precheck,
                                edge_tolerance=edge_tolerance, observer=obs, run_facts=run_facts, tags=tags or {})
                        else:
                            notes.append(f"{lock.holder()} is confirming the winner")
                    finally:
                        if lock is not None:
                            lock.close()
        except Interrupted as err:
            if err.reason != "timeout":
                raise
            interrupted = err  # --timeout cut a trial: it is measured again on resume
            notes.append("--timeout reached during a trial: it was stopped, is not counted, and is measured "
                         "again when the study resumes")
    if worker.halt is not None:
        raise EnvironmentFault("environment", f"stopped after {ENVIRONMENT_FAULTS_TO_STOP} environment faults in "
                               f"a row (no configuration was judged by them): {worker.halt}")
    from tuner.study import best_feasible_trial

    from tuner.study import confirmation

    total = count_finished(st)
    return SearchOutcome(st, name, storage, best_feasible_trial(st), total, worker.ran,
                         time.perf_counter() - t0, session_gpu_s, notes=notes, timed_out=interrupted is not None,
                         confirmation=confirmation(st))


def _config_key(config: dict[str, Any]) -> str:
    import json

    return json.dumps(config, sort_keys=True)


def study_noise(study: optuna.Study, backend: str) -> Any:
    """The study's :class:`~tuner.confirmation.NoiseFloor`: tokens/s of every feasible
    measurement grouped by configuration (copies of an earlier trial left out, so only
    confirmation repeats make a group of more than one)."""
    from optuna.trial import TrialState

    from tuner.confirmation import noise_floor

    groups: dict[str, list[float]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        a = t.user_attrs
        if "repeat_of" in a or "config" not in a or not a.get("feasible"):
            continue
        groups.setdefault(_config_key(a["config"]), []).append(float(t.value or 0.0))
    return noise_floor(groups.values(), backend)


def confirm_winner(
    study: optuna.Study, backend: Backend, deployment: Deployment, workload: Workload, target: float, *,
    rounds: int = CONFIRM_ROUNDS, seed: int = 0, load_kind: str = "concurrency", max_replays: int = MAX_REPLAYS,
    precheck: bool = True, edge_tolerance: float = EDGE_TOLERANCE, observer: SearchObserver | None = None,
    run_facts: dict[str, Any] | None = None, tags: dict[str, Any] | None = None,
) -> Any:
    """Measure the configurations within the noise band of the study's best ``rounds``
    more times each (fresh start; round r replays the requests in another order,
    :meth:`Workload.reordered`, and draws arrivals with seed + r; the same sample for
    every candidate) and store the decision (:mod:`tuner.confirmation`) as the study's
    ``confirmation``. Each repeat is a COMPLETE trial with ``confirm_of`` outside the
    budget, written when measured: an interrupted confirmation keeps its repeats and
    the next run reuses them. Returns the Confirmation, or None with no feasible trial."""
    from optuna.trial import TrialState, create_trial

    from tuner.confirmation import Candidate, candidates, race
    from tuner.study import confirmation, count_finished, is_feasible
    from tuner.workers import identity

    obs = observer or SearchObserver()
    fresh = confirmation(study)
    if fresh is not None and fresh.rounds >= rounds:
        return fresh
    trials = study.get_trials(deepcopy=False)
    tags = tags or {}
    fingerprint = workload.fingerprint()

    def ours(t: FrozenTrial) -> bool:
        a = t.user_attrs
        return (all(a.get(k) == v for k, v in tags.items())
                and (a.get("run") or {}).get("workload_fingerprint", fingerprint) == fingerprint)

    originals = [t for t in trials if is_feasible(t) and ours(t) and "repeat_of" not in t.user_attrs
                 and "confirm_of" not in t.user_attrs and "config" in t.user_attrs]
    if not originals:
        return None
    done = {(int(t.user_attrs["confirm_of"]), int(t.user_attrs.get("confirm_round", 0))): t
            for t in trials if "confirm_of" in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.FAIL)}
    noise = study_noise(study, backend.name)
    field_ = candidates([Candidate(t.number, dict(t.user_attrs["config"]), [float(t.value or 0.0)])
                         for t in originals], noise)
    entrants = {c.number for c in field_}
    history = []
    groups: dict[str, list[float]] = {}
    for (number, _r), t in done.items():
        if number not in entrants and t.state == TrialState.COMPLETE:
            groups.setdefault(_config_key(t.user_attrs.get("config") or {}), []).append(float(t.value or 0.0))
    history = list(groups.values())
    by_number = {t.number: t for t in originals}
    base = dict(run_facts or {})

    def measure(c: Candidate, r: int) -> float:
        if (c.number, r) in done:
            t = done[(c.number, r)]
            return float(t.value or 0.0) if t.state == TrialState.COMPLETE and t.user_attrs.get("feasible") else 0.0
        original = by_number[c.number]
        obs.on_phase(f"confirming trial {c.number}: repeat {r}/{rounds}")
        edge = (original.user_attrs.get("edge") or {}).get("level")
        config = ServeConfig.from_dict(c.config)
        attrs: dict[str, Any] = {"confirm_of": c.number, "confirm_round": r, **identity(deployment.gpu_ids or None),
                                 **tags}
        state = TrialState.COMPLETE
        value: float | None = 0.0
        constraint = 1.0
        try:
            ev = evaluate_config(backend, deployment, config, workload.reordered(seed + r), target,
                                 load_kind=load_kind, max_replays=max_replays, precheck=precheck, seed=seed + r,
                                 phase=obs.on_phase, start_level=edge if load_kind == "concurrency" else None,
                                 edge_tolerance=edge_tolerance)
        except (KeyboardInterrupt, EnvironmentFault):
            raise  # nothing measured: not recorded against the configuration
        except Exception as err:  # the server crashed on this sample: the configuration's
            state, value = TrialState.FAIL, None
            attrs.update(fail_kind="crash", fail_reason=redact(f"{type(err).__name__}: {err}")[:2000],
                         config=c.config)
        else:
            moved = {k: ev.attrs[k] for k in ("vllm_version", "log_paths", "startup_s", "plan") if k in ev.attrs}
            attrs.update({k: v for k, v in ev.attrs.items() if k not in moved})
            base.update(moved)
            value, constraint = ev.value, ev.constraint
        attrs["run"] = {**base, "load_seed": seed + r, "sample": f"reordered (seed {seed + r})"}
        study.add_trial(create_trial(
            state=state, value=value, params=original.params, distributions=original.distributions,
            user_attrs={k: _clean(v) for k, v in attrs.items()},
            constraints={CONSTRAINT: float(constraint)} if state == TrialState.COMPLETE else None))
        return float(value or 0.0) if attrs.get("feasible") else 0.0

    def on_round(r: int, alive: list[Candidate]) -> None:
        obs.on_phase(f"confirmed round {r}/{rounds}: {len(alive)} in the race")

    conf = race(field_, measure, noise, rounds=rounds, backend=backend.name, history=history, on_round=on_round)
    study.set_user_attr("confirmation", {**conf.to_dict(), "finished": count_finished(study)})
    return conf


#: Environment faults in a row after which the search stops (one may be a passing glitch).
ENVIRONMENT_FAULTS_TO_STOP = 2


def _failed(trial: optuna.Trial, config: ServeConfig, run_facts: dict[str, Any], kind: str, reason: str) -> None:
    """What a trial that is about to FAIL stores: its config, why (``fail_kind``:
    interrupted, environment or crash; :mod:`tuner.recovery`) and the run facts."""
    from tuner.recovery import mark_failed

    reason = redact(reason)  # a message may name an endpoint with its credentials
    trial.set_user_attr("config", config.to_dict())
    trial.set_user_attr("run", run_facts)
    if kind == "crash":
        trial.set_user_attr("error", reason[:2000])
    mark_failed(trial.study, trial._trial_id, kind, reason)


def _check_gpu(space: SearchSpace, backend: Backend, obs: SearchObserver) -> None:
    """A GPU tuner's catalog does not know: the simulator cannot run it (bad input, with
    the space file's line); a real vLLM can, without pre-check or prediction (a warning)."""
    from tuner.sim.hardware import get_gpu

    try:
        get_gpu(space.deployment.gpu)
    except InputError as err:
        simulated = backend.name == "sim" or any(
            "sim-serve" in a or a == "tuner.sim.server" for a in str(getattr(backend, "vllm_cmd", "")).split())
        if simulated:
            raise space.error(err.message, ("deployment", "gpu"), hint=err.hint) from err
        obs.on_warning(f"{err.message}: no pre-check and no prediction for this GPU (add it to "
                       "~/.config/tuner/gpus.yaml to get both)")


def _stale_servers(obs: SearchObserver, kill: bool) -> None:
    """Report (and with ``kill``, stop) servers a dead tuner run left on this host."""
    from tuner.processes import stale_servers, stop_group

    for server in stale_servers():
        if kill:
            gone = stop_group(server.pgid)
            obs.on_warning(f"stopped a server left by a dead run: {server.describe()}"
                           + ("" if gone else " (it did not stop; see tuner doctor)"))
        else:
            obs.on_warning(f"a server left by a dead run is still running: {server.describe()}; "
                           "stop it with --kill-stale or tuner doctor --kill-stale")


class _quiet_optuna:
    """Optuna logs every failed trial with its traceback at WARNING; the search reports
    failures itself, in one line (``SearchObserver.on_warning``)."""

    def __enter__(self) -> None:
        import optuna

        self.level = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        import optuna

        optuna.logging.set_verbosity(self.level)


def _propose(study: optuna.Study, space: SearchSpace, predictor: Predictor, best: float | None) -> None:
    """Enqueue, as the next trial, the neighbour of the best trial (one knob or the layout
    changed) that the predictor expects most of, among those it would launch (no predicted
    twin of a measured trial, nothing under the pruning share of the best, not tried)."""
    from tuner.predictor import advise
    from tuner.study import best_feasible_trial

    incumbent = best_feasible_trial(study)
    if incumbent is None:
        return
    trials = study.get_trials(deepcopy=False)
    tried = {tuple(sorted(t.params.items())) for t in trials}
    scored = []
    for key, values in _snapped_grid(space).items():
        for value in values:
            params = {**incumbent.params, key: value}
            if tuple(sorted(params.items())) in tried:
                continue
            config = space.config_from_params(params)
            advice = advise(trials, config, predictor.predict(config), best)
            if advice.prediction and not advice.prune:
                scored.append((advice.expected_value or advice.prediction.get("tokens_per_s") or 0.0, params))
    if scored:
        study.enqueue_trial(max(scored, key=lambda x: x[0])[1], user_attrs={"proposed_by": "predictor"},
                            skip_if_exists=True)


def _prune(trial: optuna.Trial, config: ServeConfig, advice: Advice, run_facts: dict[str, Any]) -> None:
    """Record a configuration the predictor ruled out, without launching it: PRUNED,
    with the prediction as evidence (TPE ranks pruned trials below every measured one)."""
    import optuna

    pred = advice.prediction
    p95 = pred.get("p95_ttft_s")
    target = trial.study.user_attrs.get("target_ttft_s")
    constraint = p95 / target - 1.0 if pred["feasible"] and p95 and target else 1.0
    trial.set_constraint(CONSTRAINT, constraint)
    for key, value in (("config", config.to_dict()), ("prediction", pred), ("pruned_reason", advice.reason),
                       ("feasible", False), ("gpu_s", 0.0), ("run", run_facts), ("twin_of", advice.twin_of)):
        if value is not None:
            trial.set_user_attr(key, _clean(value))
    trial.report(float(advice.value), step=0)
    raise optuna.TrialPruned(advice.reason)


def _best_value(study: optuna.Study) -> float | None:
    from tuner.study import best_feasible_trial

    best = best_feasible_trial(study)
    return None if best is None else float(best.value)


def _same_config(study: optuna.Study, config: ServeConfig, fingerprint: str | None = None,
                 tags: dict[str, Any] | None = None) -> FrozenTrial | None:
    """An earlier COMPLETE trial of ``study`` that ran exactly ``config`` (on the same
    workload and with the same ``tags``, when given)."""
    from optuna.trial import TrialState

    wanted = config.to_dict()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("config") != wanted or "repeat_of" in t.user_attrs or "confirm_of" in t.user_attrs:
            continue
        if fingerprint and (t.user_attrs.get("run") or {}).get("workload_fingerprint", fingerprint) != fingerprint:
            continue
        if any(t.user_attrs.get(k) != v for k, v in (tags or {}).items()):
            continue
        return t
    return None


def _stamp_study(st: optuna.Study, space: SearchSpace, deployment: Deployment, fingerprint: str,
                 backend: str, sampler: str, seed: int, target: float) -> None:
    if st.user_attrs.get("space"):
        return
    st.set_user_attr("space", space.name)
    st.set_user_attr("space_path", space.path)
    st.set_user_attr("deployment", deployment.to_dict())
    st.set_user_attr("workload_fingerprint", fingerprint)
    st.set_user_attr("backend", backend)
    st.set_user_attr("sampler", sampler)
    st.set_user_attr("seed", seed)
    st.set_user_attr("target_ttft_s", target)
    st.set_user_attr("load_kind", space.workload.load)


def warm_start_configs(space: SearchSpace, workload: Workload, *, k: int = 3, budget: int = 40,
                       seed: int = 0, storage: str | None = None, observer: SearchObserver | None = None,
                       ) -> list[ServeConfig]:
    """Run (or reuse) a simulator study of the same space and workload and return its
    ``k`` best feasible configurations, to enqueue as the first real trials."""
    from tuner.study import trial_config

    outcome = run_search(space, backend="sim", workload=workload, budget=budget, seed=seed,
                         storage=storage, observer=observer)
    return [trial_config(t) for t in top_feasible_trials(outcome.study, k)]


# -- the command line to copy -------------------------------------------------------------
def serve_command(deployment: Deployment, config: ServeConfig) -> str:
    """The ``vllm serve`` command line of ``config`` for the deployment's vLLM version
    (flags from :func:`tuner.backends.vllm_args.render_flags`, without host and port).
    Replicas become ``--data-parallel-size`` (independent engine replicas behind one API
    server; max-num-seqs applies per replica there too)."""
    import shlex

    from tuner.backends.vllm_args import render_flags
    from tuner.sim.model import serve_model_name

    flags = render_flags(deployment, config, deployment.vllm_version, host="0.0.0.0", port=8000)
    argv = ["vllm", "serve", serve_model_name(deployment.model)]
    skip = False
    for flag in flags:
        if skip or flag in ("--host", "--port"):
            skip = not skip
            continue
        argv.append(flag)
    if config.replicas > 1:
        argv += ["--data-parallel-size", str(config.replicas)]
    return shlex.join(argv)


__all__ = [
    "Evaluation", "SearchObserver", "SearchOutcome", "build_workload", "default_trials",
    "error_stop_hook", "evaluate_config", "make_sampler", "planner_precheck", "run_search", "serve_command",
    "slo_stop_hook", "warm_start_configs",
]

"""Capacity planning: how much traffic does one configuration hold at a P95 TTFT target?

:func:`plan_capacity` takes a configuration (a study's best feasible trial, a chosen
trial, or one given directly), starts it once on a backend, and sweeps the load:

1. **Sweep.** Closed-loop users (default article 004's 5, 10, 20, 50, 80, 120, 160) or
   open-loop Poisson rates, recording mean/P95 TTFT, TPOT, E2E, tokens/s (in+out and
   output) and requests/s per level. The default levels stop at the first one over the
   target (kept: the curve brackets the edge); levels given are all run. While every
   level meets the target the sweep goes on in x1.5 steps (at most ``max_extensions``;
   users capped at half the workload, so a run is more than one burst); when even the
   lowest misses it halves down to 1 user.
2. **Interpolate.** The largest load meeting the target by monotone (PCHIP)
   interpolation of P95 TTFT against load (:func:`tuner.capacity.max_load_meeting`).
3. **Verify.** One more run at that load (users rounded down). If it misses, the point
   joins the curve, the answer is interpolated again below it (at most 3 tries), else
   the largest measured load that met the target; the notes say so.
4. **Figures.** Conversations per minute, replicas for a demand, cost
   (:mod:`tuner.capacity`); ``repeats`` > 1 reruns 1-3 with other seeds (another sample
   of the synthetic mix, or 90% of a trace's rows) and gives each figure a (min, max) range.

**Workload.** Plan replays the requests the study searched on: the file it read
(``workload_file`` of the trial's run; never a log path recorded inside a converted file),
or its synthetic mix with more requests (:data:`PLAN_REQUESTS`, a larger sample of the
same distribution). The fingerprint is checked against the trial's: a workload plan
picked itself that is not the study's is refused (InputError); one given on purpose
(``workload=``, ``--trace``) is replayed with a warning. ``CapacityEstimate.workload``
records what was replayed and how it stands to the study's.

The estimate is stored in the study (``study.user_attrs["plan/trial-<n>/ttft-<t>s"]``,
JSON) so that notebooks read it back with :func:`load_plan`, and can be written as
Markdown and a PNG (:func:`write_plan_files`).

For a backend that runs faster than real time (``tuner sim-serve --speed 20``),
``time_scale=20`` multiplies every measured time by 20 and divides throughputs by 20
(and offers open-loop rates 20x faster), so the figures are in the simulated GPU's time.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.capacity import (
    RANGED,
    CapacityEstimate,
    ReplayedWorkload,
    SweepPoint,
    list_plans,
    max_load_meeting,
    plan_key,
    store_plan,
    stored_plan,
)
from tuner.demand import (
    Demand,
    conversations_per_min,
    cost_figures,
    parse_demand,
    replicas_needed,
    requests_per_conversation,
)
from tuner.config import Deployment, ServeConfig
from tuner.errors import InputError, NoFeasibleConfig
from tuner.record import StudyRecord, TrialRecord
from tuner.storage import STUDIES_DIR

if TYPE_CHECKING:
    import optuna

    from tuner.search.backend import Backend
    from tuner.result import RunResult
    from tuner.space import WorkloadSpec
    from tuner.traffic.workload import Workload

#: Article 004's concurrency levels (section 5).
ARTICLE_LEVELS = (5, 10, 20, 50, 80, 120, 160)
EXTEND_FACTOR = 1.5
MAX_EXTENSIONS = 8
MAX_VERIFY_TRIES = 3
#: Requests in the built-in mix for a plan (a study's own count when larger).
PLAN_REQUESTS = 1000


# -- where the configuration comes from ---------------------------------------------------
def find_newest_study(folder: Path | str = STUDIES_DIR, storage: str | None = None) -> tuple[str, str | None]:
    """``(name, storage)`` of the newest study: the last one created in the most recently
    written ``studies/*.db`` (storage ``None`` when the file is ``studies/<name>.db``,
    the default), or the last created in ``storage``. InputError when there is none."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage is not None:
        from tuner.storage import driver_url  # postgresql:// with the driver that is installed

        names = optuna.get_all_study_names(driver_url(storage))
        if not names:
            raise InputError(f"no study in {storage}", hint="run tuner search first, or give --study")
        return names[-1], storage
    for db in sorted(Path(folder).glob("*.db"), key=lambda p: p.stat().st_mtime, reverse=True):
        url = f"sqlite:///{db}"
        names = optuna.get_all_study_names(url)
        if names:
            name = names[-1]
            return name, None if db == Path(folder) / f"{name}.db" else url
    raise InputError(f"no study in {folder}/",
                     hint="run tuner search first, give --study/--storage, or a config with --gpu/--model/--tp ...")


def newest_study(folder: Path | str = STUDIES_DIR, storage: str | None = None) -> str:
    """Name of the newest study (see :func:`find_newest_study`, which also gives its storage)."""
    return find_newest_study(folder, storage)[0]


#: What to do when plan cannot replay the study's own requests.
FIX = "give --trace FILE to plan on another workload on purpose"


@dataclass(frozen=True, slots=True)
class _Studied:
    """What a trial says of the workload its study searched on (its record's ``run``,
    written by :func:`tuner.search.run_search`; the study's stamp for the fingerprint of
    trials that predate it). ``file`` is absent in studies made before it was recorded."""

    study: str
    fingerprint: str | None = None
    requests: int | None = None
    file: str | None = None
    source: str | None = None
    load_kind: str | None = None

    @classmethod
    def of(cls, study: optuna.Study, trial: Any) -> _Studied:
        run, stamp = TrialRecord.from_trial(trial).run, StudyRecord.from_study(study)
        requests = run.workload_requests
        return cls(study=study.study_name, fingerprint=run.workload_fingerprint or stamp.workload_fingerprint,
                   requests=int(requests) if isinstance(requests, int) else None,
                   file=run.workload_file or None, source=run.workload_source or None,
                   load_kind=run.load_kind or stamp.load_kind)

    def described(self) -> str:
        count = "?" if self.requests is None else f"{self.requests:,}"
        return f"{count} requests (fingerprint {self.fingerprint})"


@dataclass(frozen=True, slots=True)
class _Chosen:
    """The workload plan replays: ``base`` (the first repeat), ``build(seed)`` for another
    sample of a synthetic mix (``None``: repeats replay 90% of ``base``'s rows), the file
    read, how it stands to the study's (:data:`tuner.capacity.MATCHES`) and what to say."""

    base: Workload
    build: Callable[[int], Workload] | None = None
    file: str | None = None
    match: str = "unchecked"
    notes: tuple[str, ...] = ()


def _refuse(studied: _Studied, replays: Workload, why: str = "") -> InputError:
    return InputError(f"study {studied.study!r} was searched on {studied.described()}, but plan would replay "
                      f"{len(replays):,} requests of {replays.source} (fingerprint {replays.fingerprint()})"
                      f"{why}", hint=FIX)


def _study_spec(study: optuna.Study, studied: _Studied) -> tuple[WorkloadSpec | None, str | None]:
    """The study's search space's workload section with the load kind the study ran
    (``tuner search --load`` changes it), and the space's name or path; ``None`` when
    the space cannot be read."""
    from tuner.space import LOAD_KINDS, load_space

    stamp = StudyRecord.from_study(study)
    path = stamp.space_path or stamp.space
    if not path:
        return None, None
    try:
        spec = load_space(path).workload
    except InputError:
        return None, str(path)
    if studied.load_kind in LOAD_KINDS and studied.load_kind != spec.load:
        spec = dataclasses.replace(spec, load=studied.load_kind)
    return spec, str(path)


def _from_file(studied: _Studied, candidates: Sequence[str], num_requests: int | None) -> _Chosen:
    """The study's file: the first candidate whose rows (all, or the first
    ``num_requests``) are the study's requests; InputError naming both fingerprints when
    none is."""
    from tuner.traffic import load_trace

    first = load_trace(candidates[0])
    for path in candidates:
        whole = first if path == candidates[0] else load_trace(path)
        n = len(whole) if not num_requests else min(num_requests, len(whole))
        part = whole if n == len(whole) else whole.take(slice(0, n))
        notes: list[str] = []
        if num_requests and num_requests > len(whole):
            notes.append(f"--num-requests {num_requests:,} is more than the {len(whole):,} requests of {path}: "
                         "all of them replayed")
        if studied.fingerprint is None:
            notes.append(f"the study recorded no workload fingerprint: plan replays {len(part):,} requests of "
                         f"{path} without checking that they are the study's")
            return _Chosen(part, file=str(Path(path).resolve()), match="unchecked", notes=tuple(notes))
        if part.fingerprint() == studied.fingerprint:
            return _Chosen(part, file=str(Path(path).resolve()), match="same", notes=tuple(notes))
        if part is not whole and whole.fingerprint() == studied.fingerprint:
            notes.append(f"plan replays the first {n:,} of the study's {len(whole):,} requests of {path} "
                         f"(--num-requests; fingerprint {part.fingerprint()}, the study's {studied.fingerprint}): "
                         "a subset, on purpose")
            return _Chosen(part, file=str(Path(path).resolve()), match="first-rows", notes=tuple(notes))
    raise _refuse(studied, first)


def _study_workload_builder(study: optuna.Study, trial: Any, num_requests: int | None, seed: int = 0) -> _Chosen:
    """The study's workload, checked against the trial's fingerprint.

    The file the study read (``workload_file``, never a path recorded inside a converted
    file); for older studies its ``workload_source`` or the space's ``trace`` when that is
    a file here (the first one whose requests are the study's); the first
    ``num_requests`` rows when given. Else the search space's synthetic mix, rebuilt and
    checked as the study searched on it, then sampled with ``num_requests`` (default at
    least :data:`PLAN_REQUESTS`) requests at the study's seed + ``seed``: a deliberate
    other sample of the same distribution, and the notes say so. InputError (plan would
    replay other requests than the study's) names both fingerprints and ``--trace``."""
    from tuner.search import build_workload
    from tuner.traffic.synth import default_workload

    studied = _Studied.of(study, trial)
    spec, space = _study_spec(study, studied)
    if studied.file:
        if not Path(studied.file).is_file():
            raise InputError(f"study {studied.study!r} was searched on {studied.file}, which is not there any more",
                             hint=FIX)
        return _from_file(studied, [studied.file], num_requests)
    candidates = [p for p in (studied.source, spec.trace if spec else None) if p and Path(p).is_file()]
    if candidates:
        return _from_file(studied, list(dict.fromkeys(candidates)), num_requests)
    if spec is None or spec.trace:
        n = num_requests or PLAN_REQUESTS
        base = default_workload(seed=seed, n=n)
        if studied.fingerprint is None:
            return _Chosen(base, lambda s: default_workload(seed=s, n=n), notes=(
                f"plan replays the built-in mix ({n:,} requests): the study's workload cannot be rebuilt and "
                "recorded no fingerprint to check",))
        why = (f": the study's file {spec.trace} is not here" if spec and spec.trace
               else f": its search space {space} cannot be read" if space else ": it recorded no search space")
        raise _refuse(studied, base, why)
    if studied.fingerprint is not None:
        searched = build_workload(spec)
        if searched.fingerprint() != studied.fingerprint:
            raise InputError(f"study {studied.study!r} was searched on {studied.described()}, but its search space "
                             f"{space} now builds {len(searched):,} requests (fingerprint {searched.fingerprint()})",
                             hint=FIX)
    n = num_requests or max(spec.requests, PLAN_REQUESTS)

    def build(s: int) -> Workload:
        return build_workload(dataclasses.replace(spec, requests=n, seed=spec.seed + s))

    base = build(seed)
    if base.fingerprint() == studied.fingerprint:
        return _Chosen(base, build, match="same")
    size = "a larger" if n > spec.requests else "a smaller" if n < spec.requests else "another"
    said = (f"plan replays {n:,} requests of the study's synthetic mix (seed {spec.seed + seed}, fingerprint "
            f"{base.fingerprint()}): {size} sample of the distribution the study searched on {spec.requests:,} "
            f"requests (seed {spec.seed}")
    if studied.fingerprint is None:
        return _Chosen(base, build, notes=(said + "; the study recorded no fingerprint to check)",))
    return _Chosen(base, build, match="same-mix", notes=(said + f", fingerprint {studied.fingerprint})",))


def _given(workload: Workload, studied: _Studied | None, warn: Callable[[str], None]) -> _Chosen:
    """A workload given on purpose (``--trace``): replayed as it is, with a warning when
    it is not the study's."""
    file = str(Path(workload.source).resolve()) if Path(workload.source).is_file() else None
    if studied is None or studied.fingerprint is None:
        return _Chosen(workload, file=file)
    if workload.fingerprint() == studied.fingerprint:
        return _Chosen(workload, file=file, match="same")
    text = (f"study {studied.study!r} was searched on {studied.described()}; plan replays {len(workload):,} "
            f"requests of {workload.source} (fingerprint {workload.fingerprint()}), as given with --trace")
    warn(text)
    return _Chosen(workload, file=file, match="other", notes=(text,))


def _resample(workload: Workload, seed: int, share: float = 0.9) -> Workload:
    """Another sample of a given workload for a repeat: ``share`` of its rows, in order."""
    rng = np.random.default_rng(seed)
    n = len(workload)
    keep = np.sort(rng.choice(n, size=max(1, int(round(share * n))), replace=False))
    return workload.take(keep)


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


class _Sweeper:
    """Runs load levels on one started instance, for one repeat."""

    def __init__(self, instance: Any, workload: Workload, kind: str, *, time_scale: float, repeat: int,
                 seed: int, say: Callable[[str], None]) -> None:
        self.instance, self.workload, self.kind = instance, workload, kind
        self.time_scale, self.repeat, self.seed, self.say = time_scale, repeat, seed, say
        self.points: list[SweepPoint] = []

    def run(self, level: float, role: str) -> SweepPoint:
        from tuner.search import load_for

        offered = level * self.time_scale if self.kind == "rate" else level
        load = load_for(self.kind, offered, self.workload, self.seed)
        label = f"{int(level)} users" if self.kind == "concurrency" else f"{level:.4g} req/s"
        self.say(f"repeat {self.repeat + 1}: {role} run at {label}")
        result = rescale(self.instance.run(self.workload, load), self.time_scale)
        point = SweepPoint.from_summary(level, label, result.summary(), role=role, repeat=self.repeat, seed=self.seed)
        self.points.append(point)
        return point

    def measured(self, level: float) -> SweepPoint | None:
        return next((p for p in self.points if p.level == level), None)


def _snap(level: float, kind: str) -> float:
    return float(max(1, math.floor(level + 1e-9))) if kind == "concurrency" else float(level)


def _sweep_once(sw: _Sweeper, levels: Sequence[float], target: float, *, max_extensions: int,
                cap: float, notes: list[str], stop_at_miss: bool = False) -> tuple[SweepPoint, float, str, bool]:
    """Steps 1-3 for one repeat: (chosen point, interpolated level, bound, verified).
    With ``stop_at_miss`` the sweep ends at the first level over the target (kept, so that
    the curve brackets the edge); loads beyond it are not run."""
    from tuner.search import MAX_ERROR_RATE

    kind = sw.kind
    todo = sorted(set(levels))
    for i, level in enumerate(todo):
        point = sw.run(level, "sweep")
        if stop_at_miss and not point.meets(target, MAX_ERROR_RATE) and i + 1 < len(todo):
            skipped = ", ".join(f"{v:g}" for v in todo[i + 1:])
            notes.append(f"the sweep stopped at {point.load}, the first load over the target ({skipped} not run)")
            break

    def curve() -> tuple[list[float], list[float]]:
        pts = sorted(sw.points, key=lambda p: p.level)
        return ([p.level for p in pts],
                [p.ttft_p95_s if p.error_rate <= MAX_ERROR_RATE else math.inf for p in pts])

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
    interpolated = float(crossing.level)
    level = _snap(interpolated, kind)
    for _ in range(MAX_VERIFY_TRIES):
        point = sw.measured(level)
        if point is None:
            point = sw.run(level, "verify")
        if point.meets(target, MAX_ERROR_RATE):
            return point, interpolated, "interpolated", True
        notes.append(f"verify run at {point.load} missed (P95 TTFT {point.ttft_p95_s:.3g} s > {target:g} s); "
                     f"stepped down")
        crossing = max_load_meeting(*curve(), target)
        if crossing.level is None:
            break
        nxt = _snap(crossing.level, kind)
        level = min(nxt, level - 1) if kind == "concurrency" else min(nxt, level * 0.95)
        if level < 1 and kind == "concurrency":
            break
    passing = [p for p in sw.points if p.meets(target, MAX_ERROR_RATE)]
    if not passing:
        raise NoFeasibleConfig(f"no load met the {target:g} s P95 TTFT target on verification")
    best = max(passing, key=lambda p: p.level)
    notes.append(f"fell back to the largest measured load that met the target: {best.load}")
    return best, interpolated, "interpolated", False


def _figures(point: SweepPoint, kind: str, *, tpc: float | None, rpc: float | None, demand: Demand | None,
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


def plan_capacity(
    target_ttft_s: float | str,
    *,
    study: optuna.Study | str | None = None,
    storage: str | None = None,
    trial: int | None = None,
    config: ServeConfig | None = None,
    deployment: Deployment | None = None,
    workload: Workload | None = None,
    num_requests: int | None = None,
    backend: Backend | str = "sim",
    backend_options: dict[str, Any] | None = None,
    levels: Sequence[float] | None = None,
    rates: Sequence[float] | None = None,
    max_extensions: int = MAX_EXTENSIONS,
    tokens_per_conversation: float | None = None,
    demand: Demand | str | float | None = None,
    headroom: float = 0.2,
    gpu_hour_cost: float | None = None,
    repeats: int = 1,
    seed: int = 0,
    time_scale: float | None = None,
    store: bool = True,
    progress: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> CapacityEstimate:
    """Plan the capacity of one configuration at a P95 TTFT target (module docstring).

    The configuration is ``config`` (on ``deployment``, default :class:`Deployment`), or
    trial ``trial`` of ``study`` (an Optuna study or a name in ``storage``), or that
    study's best feasible trial. ``workload`` defaults to the study's: the file its trial
    read (the first ``num_requests`` rows when given), or its search space's synthetic mix
    with ``num_requests`` (default at least :data:`PLAN_REQUESTS`) requests; without a
    study the built-in 40/40/20 mix. A ``workload`` given that is not the study's is
    replayed after ``warn(line)`` (default :func:`warnings.warn`). ``levels`` are
    closed-loop users (default :data:`ARTICLE_LEVELS`, stopping at the first level over
    the target); ``rates`` (requests/s) switch to open loop. ``demand``
    (``"1200/min"``, ``"20req/s"``, a :class:`Demand` or conversations/min) gives
    ``replicas``; ``gpu_hour_cost`` (per GPU-hour) gives costs. ``time_scale`` defaults
    to the ``--speed`` of a ``sim-serve`` ``vllm_cmd`` in ``backend_options``, else 1.

    Raises InputError (no such study/trial; the study's workload cannot be rebuilt: its
    file changed or is gone, its space builds other requests), NoFeasibleConfig (no
    feasible trial, or even the lowest load misses the target), ConfigRejected (the configuration does not start).
    The estimate is stored in the study unless ``store`` is False or there is no study.
    """
    from tuner.search import get_backend_by_name
    from tuner.units import parse_seconds
    from tuner.study import best_feasible_trial, is_feasible, load_study_by_name, trial_config

    target = parse_seconds(target_ttft_s, what="--target-ttft")
    say = progress or (lambda text: None)
    if repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {repeats}")
    if levels is not None and rates is not None:
        raise InputError("give concurrency levels or rates, not both")
    kind = "rate" if rates is not None else "concurrency"
    default_grid = rates is None and levels is None
    grid = [float(v) for v in (rates if rates is not None else (levels or ARTICLE_LEVELS))]
    if not grid or any(not v > 0 for v in grid):
        raise InputError(f"load levels must be > 0, got {grid}")
    if kind == "concurrency":
        grid = [float(int(v)) for v in grid]
    dem = demand if isinstance(demand, Demand) or demand is None else parse_demand(demand)
    notes: list[str] = []

    def warned(text: str) -> None:
        warnings.warn(text, UserWarning, stacklevel=3)

    st = None
    trial_number: int | None = None
    studied: _Studied | None = None
    chosen_workload: _Chosen | None = None
    if config is None:
        if study is None or isinstance(study, str):
            name, storage = (study, storage) if study else find_newest_study(storage=storage)
            st = load_study_by_name(name, storage)
        else:
            st = study
        if trial is None:
            chosen = best_feasible_trial(st)
            if chosen is None:
                raise NoFeasibleConfig(f"study {st.study_name!r} has no feasible trial to plan from",
                                       )
        else:
            chosen = next((t for t in st.get_trials(deepcopy=False) if t.number == trial), None)
            if chosen is None:
                raise InputError(f"study {st.study_name!r} has no trial {trial}",
                                 hint=f"trials: 0-{len(st.trials) - 1}" if st.trials else "the study is empty")
            if not is_feasible(chosen):
                notes.append(f"trial {trial} did not meet the study's target in the search")
        trial_number = chosen.number
        config = trial_config(chosen)
        deployment = deployment or StudyRecord.from_study(st).deployment
        studied = _Studied.of(st, chosen)
        if workload is None:
            chosen_workload = _study_workload_builder(st, chosen, num_requests, seed)
    elif study is not None:
        st = load_study_by_name(study, storage) if isinstance(study, str) else study
    deployment = deployment or Deployment()
    if workload is not None:
        chosen_workload = _given(workload, studied, warn or warned)
    elif chosen_workload is None:  # a configuration given directly: the built-in mix
        from tuner.traffic.synth import default_workload

        n = num_requests or PLAN_REQUESTS
        chosen_workload = _Chosen(default_workload(seed=seed, n=n), lambda s: default_workload(seed=s, n=n))
    base, builder = chosen_workload.base, chosen_workload.build
    notes += chosen_workload.notes
    if repeats > 1:
        again = (f"other samples of the mix (seeds {seed + 1}-{seed + repeats - 1})" if builder is not None
                 else "90% of these requests each, in order (seeded)")
        notes.append(f"repeats 2-{repeats} replay {again}")

    def workload_for(k: int) -> Workload:
        if k == 0:
            return base
        return builder(seed + k) if builder is not None else _resample(base, seed + k)

    backend_obj = get_backend_by_name(backend, **dict(backend_options or {})) if isinstance(backend, str) else backend
    if time_scale is None:
        time_scale = backend_obj.time_scale
    if not time_scale > 0:
        raise InputError(f"--time-scale must be > 0, got {time_scale}")
    if time_scale != 1.0:
        notes.append(f"measured times x{time_scale:g} (the server ran {time_scale:g}x faster than real time)")

    rpc = requests_per_conversation(base.session)
    tpc = tokens_per_conversation
    if tpc is None and rpc is None:
        tpc = float(base.prompt_tokens.mean() + base.output_tokens.mean()) if len(base) else 1.0
        notes.append(f"one conversation = one request of the workload's mean {tpc:.0f} tokens "
                     "(give --tokens-per-conversation to change it)")
    basis = "tokens" if tpc is not None else "requests"

    say("pre-check")
    backend_obj.precheck(deployment, config)
    say("starting")
    instance = backend_obj.start(deployment, config)
    per_repeat: list[dict[str, Any]] = []
    points: list[SweepPoint] = []
    with instance:
        for k in range(repeats):
            wl = workload_for(k)
            sw = _Sweeper(instance, wl, kind, time_scale=time_scale, repeat=k, seed=seed + k, say=say)
            rnotes: list[str] = []
            cap = float(max(1, len(wl) // 2)) if kind == "concurrency" else math.inf
            point, interp, bound, verified = _sweep_once(sw, grid, target, max_extensions=max_extensions,
                                                         cap=cap, notes=rnotes, stop_at_miss=default_grid)
            figs = _figures(point, kind, tpc=tpc, rpc=rpc, demand=dem, headroom=headroom,
                            gpu_hour_cost=gpu_hour_cost, gpus=config.gpus_needed)
            figs.update(interpolated_load=interp, bound=bound, verified=verified)
            per_repeat.append(figs)
            points += sw.points
            prefix = f"repeat {k + 1}: " if repeats > 1 else ""
            notes += [prefix + n for n in rnotes]
    order = sorted(range(repeats), key=lambda k: per_repeat[k]["max_load"])
    head = dict(per_repeat[order[(repeats - 1) // 2]])  # the (lower) median repeat, figures kept together
    ranges: dict[str, tuple[float, float]] = {}
    if repeats > 1:
        for key in RANGED:
            vals = [r[key] for r in per_repeat if r.get(key) is not None]
            if vals:
                ranges[key] = (float(min(vals)), float(max(vals)))
        head["bound"] = "at_least" if all(r["bound"] == "at_least" for r in per_repeat) else "interpolated"
        head["verified"] = all(r["verified"] for r in per_repeat)
    est = CapacityEstimate(
        target_ttft_s=target, load_kind=kind,
        tokens_per_conversation=tpc, requests_per_conversation=rpc if basis == "requests" else None,
        conversation_basis=basis,
        demand_per_min=None if dem is None else dem.per_min, demand_unit="conversations" if dem is None else dem.unit,
        headroom=headroom, gpus=config.gpus_needed, gpu_hour_cost=gpu_hour_cost, repeats=repeats,
        ranges=ranges, sweep=tuple(points), notes=tuple(notes),
        study=None if st is None else st.study_name, trial=trial_number, backend=backend_obj.name,
        config=config.to_dict(), deployment=deployment.to_dict(),
        workload=ReplayedWorkload(
            source=base.source, requests=len(base), fingerprint=base.fingerprint(), file=chosen_workload.file,
            match=chosen_workload.match, study_fingerprint=None if studied is None else studied.fingerprint,
            study_requests=None if studied is None else studied.requests),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **{k: v for k, v in head.items() if k in _ESTIMATE_FIELDS},
    )
    if store and st is not None:
        store_plan(st, est)
    return est


_ESTIMATE_FIELDS = {f.name for f in dataclasses.fields(CapacityEstimate)}


def load_plan(study: optuna.Study | str, *, trial: int | None = None, target_ttft_s: float | str | None = None,
              storage: str | None = None) -> CapacityEstimate | None:
    """The stored plan for ``trial`` at ``target_ttft_s`` (either may be left out: then
    the newest matching plan), or ``None``. ``study`` is an Optuna study or a name
    (:func:`tuner.capacity.stored_plan` reads it)."""
    from tuner.study import load_study_by_name

    st = load_study_by_name(study, storage) if isinstance(study, str) else study
    return stored_plan(st, trial=trial, target_ttft_s=target_ttft_s)


# -- reports ------------------------------------------------------------------------------
def _fmt_range(est: CapacityEstimate, key: str, value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    text = format(value, fmt)
    if key in est.ranges:
        lo, hi = est.ranges[key]
        text += f" ({format(lo, fmt)}–{format(hi, fmt)})"
    return text


def summary_rows(est: CapacityEstimate) -> list[tuple[str, str]]:
    """The capacity summary as (label, value) rows; ranges over repeats in brackets."""
    axis = "users" if est.load_kind == "concurrency" else "req/s"
    at_least = "≥ " if est.bound == "at_least" else ""
    rows = [
        ("target", f"P95 TTFT ≤ {est.target_ttft_s:g} s"),
        ("max concurrency", at_least + _fmt_range(est, "max_concurrency", est.max_concurrency,
                                                  ",.0f" if est.load_kind == "concurrency" else ",.1f")
         + ("" if est.load_kind == "concurrency" else " (Little's law)")),
    ]
    if est.load_kind == "rate":
        rows.append(("max load", at_least + _fmt_range(est, "max_load", est.max_load, ",.3g") + f" {axis}"))
    rows += [
        ("P95 / mean TTFT there", f"{est.ttft_p95_s:.2f} s / {est.ttft_mean_s:.2f} s"
                                  + ("" if est.verified else " (verify missed; see notes)")),
        ("requests/s", _fmt_range(est, "requests_per_s", est.requests_per_s, ",.2f")),
        ("tokens/s (in+out)", _fmt_range(est, "tokens_per_s", est.tokens_per_s, ",.0f")),
        ("output tokens/s", _fmt_range(est, "output_tokens_per_s", est.output_tokens_per_s, ",.0f")),
    ]
    per = (f"{est.tokens_per_conversation:,.0f} tokens/conversation" if est.conversation_basis == "tokens"
           else f"{est.requests_per_conversation:.2f} requests/conversation")
    rows.append(("conversations/min", _fmt_range(est, "conversations_per_min", est.conversations_per_min, ",.0f")
                 + f" at {per}"))
    if est.demand_per_min is not None:
        rows.append((f"replicas for {est.demand_per_min:,.0f} {est.demand_unit}/min",
                     _fmt_range(est, "replicas", est.replicas, "d")
                     + f" (+{est.headroom:.0%} headroom, {est.gpus} GPUs each)"))
    if est.gpu_hour_cost is not None:
        rows.append(("cost per hour", f"{est.cost_per_hour:,.2f} per deployment ({est.gpus} GPUs x {est.gpu_hour_cost:g})"
                     + ("" if est.total_cost_per_hour is None else f", {est.total_cost_per_hour:,.2f} for all replicas")))
        rows.append(("cost per million tokens", _fmt_range(est, "cost_per_million_tokens",
                                                           est.cost_per_million_tokens, ",.3f")
                     + ("" if est.cost_per_million_output_tokens is None
                        else f" (output tokens only: {est.cost_per_million_output_tokens:,.3f})")))
    return rows


def sweep_rows(est: CapacityEstimate, repeat: int = 0) -> list[SweepPoint]:
    """The points of one repeat, by load."""
    return sorted((p for p in est.sweep if p.repeat == repeat), key=lambda p: (p.level, p.role))


def workload_line(w: ReplayedWorkload | None) -> str:
    """The replayed workload in one line: source, requests, fingerprint, and the study's."""
    if w is None:
        return "not recorded"
    line = f"{w.source} ({w.requests:,} requests, fingerprint {w.fingerprint})"
    if w.match == "same":
        return line + ", the study's own"
    if w.study_fingerprint is not None:
        line += f"; the study searched on {w.study_requests or '?'} requests, fingerprint {w.study_fingerprint}"
    return line


def render_markdown(est: CapacityEstimate) -> str:
    axis = "concurrency" if est.load_kind == "concurrency" else "req/s"
    where = f"study `{est.study}` trial {est.trial}" if est.study else "a configuration given directly"
    knobs = ", ".join(f"{k}={v}" for k, v in est.config.items() if v is not None)
    dep = est.deployment
    lines = [
        f"# Capacity at P95 TTFT ≤ {est.target_ttft_s:g} s",
        "",
        f"{where}; {dep.get('gpu_count')}x {dep.get('gpu')}, {dep.get('model')}, vLLM {dep.get('vllm_version')}; "
        f"backend `{est.backend}`; workload {workload_line(est.workload)}.",
        "",
        f"Configuration: {knobs}",
        "",
        f"| {axis} | mean TTFT | P95 TTFT | mean TPOT | mean E2E | tokens/s | output tokens/s | req/s | run |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in sweep_rows(est):
        lines.append(
            f"| {p.level:.4g} | {p.ttft_mean_s * 1e3:,.0f} ms | {p.ttft_p95_s:.2f} s | {p.tpot_mean_s * 1e3:.1f} ms | "
            f"{p.e2e_mean_s:.1f} s | {p.tokens_per_s:,.0f} | {p.output_tokens_per_s:,.0f} | {p.requests_per_s:.2f} | "
            f"{p.role} |")
    lines += ["", "| capacity | |", "|---|---:|"]
    lines += [f"| {a} | {b} |" for a, b in summary_rows(est)]
    if est.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in est.notes]
    return "\n".join(lines) + "\n"


def plot_plan(est: CapacityEstimate, path: str | Path) -> Path:
    """PNG: tokens/s and P95 TTFT against load, the target line and the chosen point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in sweep_rows(est) if p.role != "verify"]
    chosen = min(sweep_rows(est), key=lambda p: abs(p.level - est.max_load))
    x = [p.level for p in pts]
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(7, 6.5))
    ax1.plot(x, [p.tokens_per_s for p in pts], "o-", label="tokens/s (in+out)")
    ax1.plot(x, [p.output_tokens_per_s for p in pts], "s--", label="output tokens/s")
    ax1.plot([chosen.level], [chosen.tokens_per_s], "r*", markersize=14, label="chosen")
    ax1.set_ylabel("tokens/s")
    ax1.legend(loc="lower right")
    ax1.grid(alpha=0.3)
    ax2.plot(x, [p.ttft_p95_s for p in pts], "o", color="tab:purple", label="P95 TTFT (measured)")
    measured = sorted(sweep_rows(est), key=lambda p: p.level)
    xs = np.unique([p.level for p in measured])
    ys = np.maximum.accumulate([np.mean([p.ttft_p95_s for p in measured if p.level == v]) for v in xs])
    if len(xs) > 1 and np.all(np.isfinite(ys)):
        from scipy.interpolate import PchipInterpolator

        grid = np.linspace(xs[0], xs[-1], 200)
        ax2.plot(grid, PchipInterpolator(xs, ys)(grid), "-", color="tab:purple", alpha=0.6,
                 label="monotone (PCHIP) fit")
    ax2.axhline(est.target_ttft_s, color="r", linestyle=":", label=f"target {est.target_ttft_s:g} s")
    ax2.plot([chosen.level], [chosen.ttft_p95_s], "r*", markersize=14)
    ax2.axvline(est.max_load, color="grey", linestyle="--", linewidth=0.8)
    ax2.set_ylabel("P95 TTFT (s)")
    ax2.set_xlabel("concurrent users" if est.load_kind == "concurrency" else "requests/s")
    ax2.legend(loc="upper left")
    ax2.grid(alpha=0.3)
    fig.suptitle(f"capacity at P95 TTFT ≤ {est.target_ttft_s:g} s: {est.max_load:.4g} "
                 f"{'users' if est.load_kind == 'concurrency' else 'req/s'}, {est.tokens_per_s:,.0f} tok/s")
    fig.tight_layout()
    from tuner.files import write_atomic
    from tuner.plots import png_bytes

    data = png_bytes(fig, dpi=110)
    plt.close(fig)
    return write_atomic(Path(path), data)


def default_out_dir(est: CapacityEstimate) -> Path:
    """``studies/<study>/`` beside the study's database, else ``studies/plans/``."""
    return STUDIES_DIR / (est.study or "plans")


def write_plan_files(est: CapacityEstimate, out_dir: str | Path | None = None) -> tuple[Path, Path]:
    """``plan-<target>.md`` and ``plan-<target>.png`` in ``out_dir`` (default :func:`default_out_dir`)."""
    folder = Path(out_dir) if out_dir is not None else default_out_dir(est)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"plan-{est.target_ttft_s:g}s" + ("" if est.trial is None else f"-trial{est.trial}")
    from tuner.files import write_atomic

    md = write_atomic(folder / f"{stem}.md", render_markdown(est))
    png = plot_plan(est, folder / f"{stem}.png")
    return md, png


__all__ = [
    "ARTICLE_LEVELS", "CapacityEstimate", "SweepPoint", "find_newest_study", "list_plans", "load_plan", "newest_study",
    "plan_capacity",
    "plan_key", "plot_plan", "render_markdown", "rescale", "store_plan", "summary_rows",
    "workload_line", "write_plan_files",
]

"""The planner: one configuration started once, its load swept at a P95 TTFT target, and
what the capacity found means (:func:`plan_capacity`; the package docstring says how)."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError, NoFeasibleConfig
from tuner.core.units import parse_seconds
from tuner.plan.sweep import Sweep, Sweeper, figures_at, sweep_growing
from tuner.plan.workload import PLAN_REQUESTS, Chosen, Studied, find_newest_study, given, resample, study_workload
from tuner.runtime.progress import observer_or_headless
from tuner.search import EDGE_TOLERANCE, edge_width, get_backend_by_name
from tuner.serving.capacity import (
    MATCHES,
    RANGED,
    CapacityEstimate,
    ReplayedWorkload,
    SweepPoint,
    store_plan,
    stored_plan,
)
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.demand import Demand, parse_demand, requests_per_conversation
from tuner.serving.slo import SloSet, split_slos
from tuner.study import best_feasible_trial, is_feasible, load_study_by_name, trial_config
from tuner.study.record import StudyRecord, TrialRecord
from tuner.study.storage import storage_fault
from tuner.traffic.synth import default_workload

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.runtime.progress import Observer
    from tuner.search.backend import Backend
    from tuner.traffic.workload import Workload

#: The target when neither it nor a study says one (a configuration given directly).
DEFAULT_TARGET_S = 5.0


@dataclass(frozen=True, slots=True)
class Figures:
    """What a capacity means for the traffic to serve (:mod:`tuner.serving.demand`).

    ``tokens_per_conversation`` (in+out, as article 004's 300; default: requests per
    conversation from the workload's session ids, else its mean tokens per request);
    ``demand`` (``"1200/min"``, ``"20req/s"``, a :class:`Demand` or conversations/min)
    gives ``replicas`` with ``headroom`` spare on top; ``gpu_hour_cost`` (per GPU-hour)
    gives costs."""

    tokens_per_conversation: float | None = None
    demand: Demand | str | float | None = None
    headroom: float = 0.2
    gpu_hour_cost: float | None = None

    def __post_init__(self) -> None:
        if self.demand is not None and not isinstance(self.demand, Demand):
            object.__setattr__(self, "demand", parse_demand(self.demand))
        if not (math.isfinite(self.headroom) and self.headroom >= 0):
            raise InputError(f"--headroom must be >= 0, got {self.headroom}")
        if self.tokens_per_conversation is not None and not self.tokens_per_conversation > 0:
            raise InputError(f"--tokens-per-conversation must be > 0, got {self.tokens_per_conversation}")
        if self.gpu_hour_cost is not None and not self.gpu_hour_cost >= 0:
            raise InputError(f"--gpu-hour-cost must be >= 0, got {self.gpu_hour_cost}")


def _chosen_trial(st: optuna.Study, trial: int | None, notes: list[str]) -> FrozenTrial:
    """Trial ``trial`` of the study, or its best feasible trial."""

    if trial is None:
        chosen = best_feasible_trial(st)
        if chosen is None:
            raise NoFeasibleConfig(f"study {st.study_name!r} has no feasible trial to plan from")
        return chosen
    chosen = next((t for t in st.get_trials(deepcopy=False) if t.number == trial), None)
    if chosen is None:
        raise InputError(f"study {st.study_name!r} has no trial {trial}",
                         hint=f"trials: 0-{len(st.trials) - 1}" if st.trials else "the study is empty")
    if not is_feasible(chosen):
        notes.append(f"trial {trial} did not meet the study's target in the search")
    return chosen


def plan_capacity(
    target_ttft_s: float | str | None = None,
    *,
    study: optuna.Study | str | None = None,
    storage: str | None = None,
    trial: int | None = None,
    config: ServeConfig | None = None,
    deployment: Deployment | None = None,
    workload: Workload | None = None,
    backend: Backend | str = "sim",
    backend_options: Mapping[str, Any] | None = None,
    sweep: Sweep = Sweep(),
    figures: Figures = Figures(),
    store: bool = True,
    observer: Observer | None = None,
    slos: Sequence[str] | None = None,
) -> CapacityEstimate:
    """Plan the capacity of one configuration at a P95 TTFT target (``tuner.plan(...)``;
    the package docstring says how).

    The configuration is ``config`` (on ``deployment``, default :class:`Deployment`), or
    trial ``trial`` of ``study`` (an Optuna study or a name in ``storage``; default the
    newest study), or that study's best feasible trial. ``target_ttft_s`` (seconds or
    ``"5s"``) defaults to the study's target, else :data:`DEFAULT_TARGET_S`. ``workload``
    defaults to the study's requests (:mod:`tuner.plan.workload`); one given that is not
    the study's is replayed after ``observer.on_warning`` (and a note says so). ``sweep``
    says how the load is swept (:class:`Sweep`), ``figures`` what the capacity means
    (:class:`Figures`); ``slos`` are service levels met besides P95 TTFT (``p99:tpot<=30ms``;
    a ``p95:ttft`` one is the target; default the study's), each sweep point naming the one
    that limits it; ``observer`` sees each phase (``None``: headless).

    Raises InputError (no such study/trial; the study's workload cannot be rebuilt: its
    file changed or is gone, its space builds other requests), NoFeasibleConfig (no
    feasible trial, or even the lowest load misses the target), ConfigRejected (the
    configuration does not start). The estimate is stored in the study unless ``store``
    is False or there is no study."""

    obs = observer_or_headless(observer)
    notes: list[str] = []
    src = _source(study, storage, trial, config, deployment, sweep, notes, want_workload=workload is None)
    slo_set = _slo_set(target_ttft_s, slos, src.study)
    deployment, config, sweep = src.deployment or Deployment(), src.config, src.sweep
    idle = deployment.idle_note(config.tensor_parallel_size, config.replicas)  # as search and estimate say it
    notes += [idle] if idle else []
    chosen_workload = _workload(workload, src, sweep, obs)
    notes += chosen_workload.notes
    backend_obj = get_backend_by_name(backend, **dict(backend_options or {})) if isinstance(backend, str) else backend
    time_scale = sweep.time_scale if sweep.time_scale is not None else backend_obj.time_scale
    if not time_scale > 0:
        raise InputError(f"--time-scale must be > 0, got {time_scale}")
    if time_scale != 1.0:
        notes.append(f"measured times x{time_scale:g} (the server ran {time_scale:g}x faster than real time)")
    est = _measure(backend_obj, deployment, config, slo_set, chosen_workload, sweep, figures, time_scale, notes, obs)
    st, studied = src.study, src.studied
    est = dataclasses.replace(
        est, study=None if st is None else st.study_name, trial=src.trial_number,
        workload=dataclasses.replace(est.workload, study_fingerprint=None if studied is None else studied.fingerprint,
                                     study_requests=None if studied is None else studied.requests))
    said = None if src.trial_number is None or st is None else agreement(src.chosen, st, est, sweep.tolerance)
    if said is not None:
        est = dataclasses.replace(est, notes=(*est.notes, said))
    return _stored(st, est) if store and st is not None else est


@dataclass(slots=True)
class _Source:
    """Where the configuration planned comes from: the study and its trial (or a
    configuration given directly), the deployment, and the sweep as the search set it."""

    config: ServeConfig
    deployment: Deployment | None
    sweep: Sweep
    study: optuna.Study | None = None
    chosen: FrozenTrial | None = None
    trial_number: int | None = None
    studied: Studied | None = None
    workload: Chosen | None = None  # the study's requests, when no workload is given


def _source(study: optuna.Study | str | None, storage: str | None, trial: int | None, config: ServeConfig | None,
            deployment: Deployment | None, sweep: Sweep, notes: list[str], *, want_workload: bool) -> _Source:
    """The configuration to plan: ``config`` as given, or trial ``trial`` of ``study`` (or
    the newest study; its best feasible trial), with the study's deployment and workload."""

    if config is not None:
        st = None
        if study is not None:
            st = load_study_by_name(study, storage) if isinstance(study, str) else study
        return _Source(config, deployment, sweep, study=st)
    if study is None or isinstance(study, str):
        name, storage = (study, storage) if study else find_newest_study(storage=storage)
        st = load_study_by_name(name, storage)
    else:
        st = study
    chosen = _chosen_trial(st, trial, notes)
    searched = TrialRecord.from_trial(chosen).edge
    if sweep.tolerance is None and searched is not None and searched.tolerance:
        sweep = dataclasses.replace(sweep, tolerance=searched.tolerance)  # the edge located as the search did
    return _Source(trial_config(chosen), deployment or StudyRecord.from_study(st).deployment, sweep, study=st,
                   chosen=chosen, trial_number=chosen.number, studied=Studied.of(st, chosen),
                   workload=study_workload(st, chosen, sweep.requests, sweep.seed) if want_workload else None)


def _slo_set(target_ttft_s: float | str | None, slos: Sequence[str] | None, st: optuna.Study | None) -> SloSet:
    """The service levels planned for: the P95 TTFT target (given, the study's, else
    :data:`DEFAULT_TARGET_S`; a ``p95:ttft`` SLO overrides it) and the other SLOs."""

    if target_ttft_s is None:
        target_ttft_s = (StudyRecord.from_study(st).target_ttft_s if st is not None else None) or DEFAULT_TARGET_S
    target = parse_seconds(target_ttft_s, what="--target-ttft")
    if slos is None:
        slos = StudyRecord.from_study(st).slos if st is not None else ()
    ttft, others = split_slos(slos)
    return SloSet.of((f"p95:ttft<={ttft or target}s",) + others)


def _workload(workload: Workload | None, src: _Source, sweep: Sweep, obs: Observer) -> Chosen:
    """The requests replayed: ``workload`` as given (a warning when it is not the study's),
    the study's, or for a configuration given directly the built-in mix."""
    if workload is not None:
        return given(workload, src.studied, obs.on_warning)
    if src.workload is not None:
        return src.workload

    n = sweep.requests or PLAN_REQUESTS
    return Chosen(default_workload(seed=sweep.seed, n=n), lambda s: default_workload(seed=s, n=n),
                  lambda s, k: default_workload(seed=s, n=k))


def _stored(st: optuna.Study, est: CapacityEstimate) -> CapacityEstimate:
    """Store ``est`` on the study; a read-only study is read, planned, and left as it is
    (a note says so)."""

    try:
        store_plan(st, est)
    except Exception as err:
        if storage_fault(err, st.study_name) is None:
            raise
        est = dataclasses.replace(est, notes=(*est.notes, f"study {st.study_name!r} cannot be written (read-only):"
                                              " this plan is shown, not stored on it"))
    return est


def _measure(backend: Backend, deployment: Deployment, config: ServeConfig, slos: SloSet, chosen: Chosen,
             sweep: Sweep, figures: Figures, time_scale: float, notes: list[str], obs: Observer) -> CapacityEstimate:
    """Start the configuration once, sweep each repeat, and make the estimate (the median
    repeat's figures, with min-max ranges over the repeats)."""
    base, builder, seed, repeats = chosen.base, chosen.build, sweep.seed, sweep.repeats
    target = float(slos.target_ttft_s)  # type: ignore[arg-type]  # the set always holds P95 TTFT
    if repeats > 1:
        again = (f"other samples of the mix (seeds {seed + 1}-{seed + repeats - 1})" if builder is not None
                 else "90% of these requests each, in order (seeded)")
        notes.append(f"repeats 2-{repeats} replay {again}")
    rpc = requests_per_conversation(base.session)
    tpc = figures.tokens_per_conversation
    if tpc is None and rpc is None:
        tpc = float(base.prompt_tokens.mean() + base.output_tokens.mean()) if len(base) else 1.0
        notes.append(f"one conversation = one request of the workload's mean {tpc:.0f} tokens "
                     "(give --tokens-per-conversation to change it)")
    obs.on_phase("pre-check")
    backend.precheck(deployment, config)
    obs.on_phase("starting")
    per_repeat: list[dict[str, Any]] = []
    points: list[SweepPoint] = []
    replayed = base
    with backend.start(deployment, config) as instance:
        for k in range(repeats):
            wl = base if k == 0 else builder(seed + k) if builder is not None else resample(base, seed + k)
            rnotes: list[str] = []
            (point, interp, bound, verified), sw = sweep_growing(
                lambda w, k=k: Sweeper(instance, w, sweep.kind, time_scale=time_scale, repeat=k, seed=seed + k,
                                       observer=obs, slos=slos),
                wl, sweep.grid, target, max_extensions=sweep.max_extensions, notes=rnotes,
                stop_at_miss=sweep.default_grid,
                grow=None if chosen.sized is None or sweep.requests else lambda n, k=k: chosen.sized(seed + k, n),  # type: ignore[misc]
                fixed=("all the rows of the file: give a longer trace" if chosen.sized is None else
                       f"-n {sweep.requests or 0:,}: give a larger -n, or none to let plan grow the workload"),
                tolerance=sweep.tolerance)
            if k == 0:
                replayed = sw.workload  # grown when the edge lay above the requests it had
            figs = figures_at(point, sweep.kind, tpc=tpc, rpc=rpc, demand=figures.demand, headroom=figures.headroom,
                              gpu_hour_cost=figures.gpu_hour_cost, gpus=config.gpus_needed)
            figs.update(interpolated_load=interp, bound=bound, verified=verified, binding_slo=point.binding_slo or None,
                        goodput_requests_per_s=point.goodput_requests_per_s)
            per_repeat.append(figs)
            points += sw.points
            notes += [(f"repeat {k + 1}: " if repeats > 1 else "") + n for n in rnotes]
    head, ranges = _median_repeat(per_repeat)
    dem = figures.demand
    return CapacityEstimate(
        target_ttft_s=target, load_kind=sweep.kind, slos=slos.texts[1:],
        tokens_per_conversation=tpc, requests_per_conversation=rpc if tpc is None else None,
        conversation_basis="tokens" if tpc is not None else "requests",
        demand_per_min=None if dem is None else dem.per_min, demand_unit="conversations" if dem is None else dem.unit,
        headroom=figures.headroom, gpus=config.gpus_needed, gpu_hour_cost=figures.gpu_hour_cost, repeats=repeats,
        ranges=ranges, sweep=tuple(points), notes=tuple(notes), backend=backend.name,
        config=config.to_dict(), deployment=deployment.to_dict(),
        workload=ReplayedWorkload(source=replayed.source, requests=len(replayed), fingerprint=replayed.fingerprint(),
                                  file=chosen.file, match=chosen.match if replayed is base or chosen.match != "same"
                                  else "same-mix"),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **{k: v for k, v in head.items() if k in _ESTIMATE_FIELDS},
    )


_ESTIMATE_FIELDS = {f.name for f in dataclasses.fields(CapacityEstimate)}


def _median_repeat(per_repeat: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, tuple[float, float]]]:
    """The (lower) median repeat's figures, kept together, and the min-max range of each
    ranged figure over the repeats (a bound and a verdict that hold for all of them)."""
    repeats = len(per_repeat)
    order = sorted(range(repeats), key=lambda k: per_repeat[k]["max_load"])
    head = dict(per_repeat[order[(repeats - 1) // 2]])
    ranges: dict[str, tuple[float, float]] = {}
    if repeats > 1:
        for key in RANGED:
            vals = [r[key] for r in per_repeat if r.get(key) is not None]
            if vals:
                ranges[key] = (float(min(vals)), float(max(vals)))
        head["bound"] = "at_least" if all(r["bound"] == "at_least" for r in per_repeat) else "interpolated"
        head["verified"] = all(r["verified"] for r in per_repeat)
    return head, ranges


def agreement(chosen: FrozenTrial, st: optuna.Study, est: CapacityEstimate, tolerance: float | None) -> str | None:
    """One note setting the plan beside what the search measured on the same trial (the edge
    it located and its tokens/s there): they agree within the share both locate the edge to,
    or the note says why the two figures differ. None when the search recorded no edge."""

    rec = TrialRecord.from_trial(chosen)
    kind = StudyRecord.from_study(st).load_kind or "concurrency"
    if rec.edge is None or rec.edge.level is None or rec.tokens_per_s is None:
        return None
    unit = "users" if kind == "concurrency" else "req/s"
    said = (f"the search held {rec.edge.level:g} {unit} on trial {chosen.number} ({rec.tokens_per_s:,.0f} tok/s"
            + ("" if rec.edge.located else ", its edge not located") + ")")
    why = [f"it swept {kind}, this plan {est.load_kind}"] * (kind != est.load_kind)
    why += [f"at its {rec.target_ttft_s:g} s target"] * (rec.target_ttft_s is not None
                                                         and not math.isclose(rec.target_ttft_s, est.target_ttft_s))
    why += ["under other SLOs"] * (split_slos(rec.slos)[1] != split_slos(est.slos)[1])  # P95 TTFT: the target
    why += [f"on its {est.workload.study_requests or 0:,} requests, this plan on {est.workload.requests:,} "
            f"({MATCHES[est.workload.match]})"] * (not est.workload.matches_study)
    if why:
        return f"{said}; this plan differs from it: {', '.join(why)}"
    tol = tolerance or rec.edge.tolerance or EDGE_TOLERANCE
    if abs(est.max_load - rec.edge.level) <= edge_width(min(est.max_load, rec.edge.level), kind, tol):
        return (f"{said}; this plan agrees, within the {tol:.0%} both locate the edge to: {est.max_load:g} {unit}, "
                f"{est.tokens_per_s:,.0f} tok/s")
    return (f"{said}; this plan found {est.max_load:g} {unit}, further apart than the {tol:.0%} both locate the edge "
            "to: the server's run-to-run noise (--repeats 3 gives this plan's range)")


def load_plan(study: optuna.Study | str, *, trial: int | None = None, target_ttft_s: float | str | None = None,
              storage: str | None = None) -> CapacityEstimate | None:
    """The stored plan for ``trial`` at ``target_ttft_s`` (either may be left out: then
    the newest matching plan), or ``None``. ``study`` is an Optuna study or a name
    (:func:`tuner.serving.capacity.stored_plan` reads it)."""

    st = load_study_by_name(study, storage) if isinstance(study, str) else study
    return stored_plan(st, trial=trial, target_ttft_s=target_ttft_s)


__all__ = ["DEFAULT_TARGET_S", "Figures", "load_plan", "plan_capacity"]

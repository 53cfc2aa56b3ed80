"""A run's set-up (:func:`open_search`): the backend checked, the workload built, the study
opened and checked against what it was made for, its first trials queued: a :class:`Setup`
the run (:class:`~tuner.search.driver.SearchRun`) receives, opened."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.core.jsonsafe import json_safe
from tuner.runtime.progress import observer_or_headless
from tuner.search.constraints import LIST_SAMPLERS, named_constraints, sampler_constraints
from tuner.search.context import TrialContext
from tuner.search.defaults import default_trials
from tuner.search.inputs import build_workload, check_requests_fit, get_backend_by_name, workload_facts, workload_file
from tuner.search.records import check_gpu, report_stale_servers, stamp_study
from tuner.search.samplers import make_sampler
from tuner.search.window import fit_to_window, replay_cost
from tuner.serving.config import ServeConfig
from tuner.serving.slo import OBJECTIVES as OBJECTIVE_UNITS
from tuner.space import space_difference
from tuner.study import count_finished, open_study, study_name
from tuner.study.record import RunFacts, StudyRecord, TrialRecord
from tuner.study.workers import worker_seed

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

    from tuner.runtime.progress import Observer
    from tuner.search.backend import Backend
    from tuner.search.prediction import Predictor
    from tuner.search.settings import SearchSettings
    from tuner.space import SearchSpace
    from tuner.traffic.workload import Workload


@dataclass(slots=True)
class Setup:
    """An opened run: the ``space`` (as the study stores it), what every trial shares
    (``ctx``: its ``workload`` fitted to the run's window), the study's ``name`` and
    ``study`` in ``storage``, the ``predictor`` (``None``: none), whether trials tell the
    sampler their constraints by name (``by_name``, :mod:`tuner.search.constraints`), the
    facts stamped on each trial (``run_facts``), its ``tags``, and ``notes`` so far."""

    space: SearchSpace
    ctx: TrialContext
    storage: str | None
    name: str
    study: optuna.Study
    predictor: Predictor | None
    by_name: bool
    run_facts: RunFacts
    tags: dict[str, Any]
    fingerprint: str
    notes: list[str] = field(default_factory=list)
    t0: float = 0.0


def open_search(space: SearchSpace, backend: Backend | str, workload: Workload | None, storage: str | None,
                study: str | None, settings: SearchSettings, *, enqueue: Sequence[ServeConfig] = (),
                observer: Observer | None = None, tags: dict[str, Any] | None = None,
                predictor: Predictor | str | None = "auto") -> Setup:
    """Everything a run needs before its first trial, checked before anything is written
    but the study: the backend's preflight, the requests (every one servable by some
    configuration), the study opened (refused when it was made for another objective, SLO
    set, space or target), vLLM's defaults and ``enqueue`` queued first, and a trace one
    trial cannot replay within ``settings.timeout_s`` sampled (the study keeps its name)."""
    t0, obs = time.perf_counter(), observer_or_headless(observer)
    backend = get_backend_by_name(backend) if isinstance(backend, str) else backend
    deployment = space.deployment
    check_gpu(space, backend, obs)
    backend.preflight(deployment)  # EnvironmentFault before any study or trial is written
    if workload is None:
        obs.on_phase("building workload")
        workload = build_workload(space.workload, deployment)
    check_requests_fit(workload, space)  # a request no configuration can serve: named before anything is written
    slo, fingerprint = space.workload.slo, workload.fingerprint()
    ctx = TrialContext(backend, deployment, workload, slo, space.workload.load, settings, observer)
    chosen = _predictor(predictor, ctx)
    name = study or study_name(deployment, fingerprint, space.name, backend.name, slo.target_ttft_s,
                               slo.key() + (".goodput" if settings.objective == "goodput" else ""))
    st, space, by_name = _open(name, storage, space, ctx, fingerprint)
    _enqueue(st, space, enqueue, settings.sampler)
    s = settings
    # a trace one trial cannot replay within --timeout: a seeded sample of it (the study keeps its name)
    fitted, sampled = fit_to_window(workload, s.timeout_s, s.max_replays, s.seed,
                                    lambda: replay_cost(backend, deployment, workload, st, space))
    facts = RunFacts(
        workload_fingerprint=fingerprint, workload_source=json_safe(workload.source),
        workload_file=workload_file(space, workload), workload_requests=len(fitted), **workload_facts(workload),
        backend=backend.name, restarts=backend.restarts, simulated=backend.simulated, hardware=deployment,
        seed=s.seed, load_seed=s.seed, sample=sampled or "as logged", sampler=s.sampler, space=space.name,
        load_kind=space.workload.load)
    if sampled:
        obs.on_warning(sampled)
    return Setup(space, replace(ctx, workload=fitted), storage, name, st, chosen, by_name, facts, dict(tags or {}),
                 fingerprint, [sampled] if sampled else [], t0)


def _predictor(predictor: Predictor | str | None, ctx: TrialContext) -> Predictor | None:
    """The simulator as predictor (``"auto"``) for a backend whose trials start a server and
    cost GPU time, when it can model the deployment; ``None``; or the one given."""
    if predictor == "auto":
        from tuner.search.prediction import sim_predictor

        s, backend = ctx.settings, ctx.backend
        if backend.restarts and backend.measures_gpu_time and s.precheck and s.early_stop:
            return sim_predictor(ctx.deployment, ctx.workload, ctx.slo, ctx.load_kind)
        return None
    if isinstance(predictor, str):
        raise InputError(f"unknown predictor {predictor!r}", hint="use 'auto', or none")
    return predictor


def _open(name: str, storage: str | None, space: SearchSpace, ctx: TrialContext,
          fingerprint: str) -> tuple[optuna.Study, SearchSpace, bool]:
    """The study, its space as the study stores it, and whether its trials tell their
    constraints by name; stamped when new, checked against what it was made for."""

    s = ctx.settings
    st = open_study(name, storage)
    stored = stored_distributions(st)
    space = space.encoded_for(stored)  # a study written with <knob>_index keeps it
    by_name = named_constraints(st) or s.sampler.lower() not in LIST_SAMPLERS  # likewise constraints by name
    st.sampler = make_sampler(s.sampler, seed=worker_seed(s.seed, storage), space=space,
                              constraints_func=None if by_name else sampler_constraints)
    stamp_study(st, space, ctx.deployment, fingerprint, ctx.backend.name, s.sampler, s.seed, ctx.slo.target_ttft_s,
                s.objective)
    record = StudyRecord.from_study(st)
    _check_made_for(name, record, ctx)
    _check_space(name, record, space, s.resume_anyway, ctx.obs)
    _check_distributions(name, space, stored)
    report_stale_servers(ctx.obs, s.kill_stale)
    ctx.obs.on_start(name, count_finished(st), s.budget)
    return st, space, by_name


def _check_made_for(name: str, record: StudyRecord, ctx: TrialContext) -> None:
    """A study is resumed for the objective, SLO set and target it was made for only: its
    trials' values and feasibility would mix two of them otherwise."""
    s, slo, target = ctx.settings, ctx.slo, ctx.slo.target_ttft_s
    if record.objective not in (None, s.objective):
        raise InputError(
            f"study {name!r} scores {record.objective} ({OBJECTIVE_UNITS[record.objective]}), not "
            f"{s.objective}: its trials' values would mix two units",
            hint=f"resume it with --objective {record.objective}, or give --study a new name")
    if tuple(record.slos) != slo.other_texts:
        raise InputError(
            f"study {name!r} was searched for {', '.join(record.slos) or 'P95 TTFT alone'}, not "
            f"{', '.join(slo.other_texts) or 'P95 TTFT alone'}: its trials' feasibility would mix two SLO sets",
            hint="resume it with the same --slo options, or give --study a new name")
    stamped = record.target_ttft_s
    if stamped is not None and abs(float(stamped) - float(target or 0.0)) > 1e-9:
        raise InputError(
            f"study {name!r} was searched for P95 TTFT <= {float(stamped):g} s, not {target:g} s: "
            "its trials' feasibility would mix two targets",
            hint=f"resume it with --target-ttft {float(stamped):g}s, or give --study a new name")


def _check_space(name: str, record: StudyRecord, space: SearchSpace, resume_anyway: bool, obs: Observer) -> None:
    """The space is part of the study's identity: the same name with another space is
    refused (its best trial may lie outside the new space), unless ``resume_anyway``."""

    if record.space_fingerprint in (None, space.fingerprint()):
        return
    what = space_difference(record.space_content or {}, space.content())
    if not resume_anyway:
        raise InputError(f"study {name!r} was searched over another space ({what})",
                         hint="give --study a new name for the new space, or --resume-anyway to add its "
                              "trials to the old ones")
    obs.on_warning(f"resuming study {name!r} over another space than it was made with ({what})")


def _check_distributions(name: str, space: SearchSpace, stored: dict[str, BaseDistribution]) -> None:
    """Optuna keeps one distribution per parameter in a study: a space resumed with
    ``--resume-anyway`` whose choices of a knob changed is refused here, in one line."""
    from optuna.distributions import CategoricalDistribution, check_distribution_compatibility

    now = {p.key: p.distribution() for p in space.params}
    if len(space.layout_choices) > 1:
        now["layout"] = CategoricalDistribution(list(space.layout_choices))
    for key, dist in now.items():
        try:
            if key in stored:
                check_distribution_compatibility(stored[key], dist)
        except ValueError as err:
            raise InputError(
                f"study {name!r} holds {key} as {_shown(stored[key])}, the space as {_shown(dist)}: "
                "Optuna cannot change a parameter's choices within a study",
                hint="give --study a new name for the new space") from err


def _enqueue(study: optuna.Study, space: SearchSpace, enqueue: Sequence[ServeConfig], sampler: str) -> None:
    """Warm-start configurations, and vLLM's defaults per layout for a new TPE/GP study."""
    trials = study.get_trials(deepcopy=False)
    waiting = {tuple(sorted(t.params.items())) for t in trials}
    first = [(space.params_of(c), TrialRecord(warm_start=True).to_attrs()) for c in enqueue]
    if not trials and sampler.lower() in ("tpe", "gp"):
        first += [(p, TrialRecord(vllm_defaults=True).to_attrs()) for p in default_trials(space)]
    for params, attrs in first:
        if tuple(sorted(params.items())) not in waiting:
            waiting.add(tuple(sorted(params.items())))
            study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)


def stored_distributions(study: optuna.Study) -> dict[str, BaseDistribution]:
    """Each parameter the study's trials hold, with the distribution Optuna stored for it."""
    out: dict[str, BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        out.update(trial.distributions)
    return out


def _shown(dist: BaseDistribution) -> str:
    from optuna.distributions import CategoricalDistribution

    if isinstance(dist, CategoricalDistribution):
        return f"choices {list(dist.choices)}"
    low, high, step = (getattr(dist, k, None) for k in ("low", "high", "step"))
    return f"{low}..{high}" + (f" step {step}" if step not in (None, 1) else "")

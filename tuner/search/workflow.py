"""What ``tuner search`` does, as one call a notebook makes too (``tuner.search(...)``):
the search space read and bound to the deployment, the workload built, the backend made,
a simulator warm start when trials cost GPU time, and the study run.

:func:`prepare` is the first half (space, deployment, workload) that ``tuner nightly``
shares; :func:`search` the whole.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.backends import backend_class
from tuner.core.errors import InputError
from tuner.core.values import replaced
from tuner.runtime.progress import observer_or_headless
from tuner.search.inputs import build_workload, num_heads
from tuner.search.outcome import SearchOutcome
from tuner.search.run import run_settings, warm_start_configs
from tuner.search.settings import SearchSettings
from tuner.serving.config import Deployment
from tuner.serving.slo import SloSet
from tuner.space import SearchSpace, load_space
from tuner.space.workload import WorkloadSpec
from tuner.study import study_name
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    from tuner.runtime.progress import Observer
    from tuner.search.backend import Backend
    from tuner.space import SearchSpace
    from tuner.traffic.workload import Workload

#: Budget of the simulator study a warm start runs first.
WARM_START_BUDGET = 40


@dataclass(frozen=True, slots=True)
class Prepared:
    """A search space bound to its deployment, and the requests its study replays."""

    space: SearchSpace
    workload: Workload

    def study_name(self, backend: str) -> str:
        """The study's default name (:func:`tuner.study.study_name`)."""

        slo = self.space.workload.slo
        return study_name(self.space.deployment, self.workload.fingerprint(), self.space.name, backend,
                          slo.target_ttft_s, slo.key())


def prepare(space: str | Path | SearchSpace = "default", *, deployment: Deployment | Mapping[str, Any] | None = None,
            workload: WorkloadSpec | Mapping[str, Any] | None = None, slo: SloSet | str | Sequence[str] | None = None,
            requests: Workload | None = None, pin: Mapping[str, Any] | None = None,
            pin_where: Mapping[str, str] | None = None) -> Prepared:
    """The search space (a shipped name, a YAML file, or a :class:`SearchSpace`) on
    ``deployment`` (a :class:`~tuner.serving.config.Deployment`, or a dict of changes to the
    space's: ``model``, ``gpu``, ``gpu_count``, ...) for ``workload`` (a
    :class:`~tuner.space.WorkloadSpec`, or a dict of changes to the space's: ``trace``,
    ``load``, ``requests``, and as a convenience ``target_ttft_s`` (seconds or ``"2s"``) and
    ``slos`` (SLO texts); ``None`` leaves a field as the space says) meeting ``slo`` (a
    :class:`~tuner.serving.slo.SloSet` or SLO texts, read once here: without a P95 TTFT bound
    the workload's target stays), bound to the deployment (layouts resolved and checked);
    ``requests`` replaces the workload the space would build. ``pin`` fixes knobs at values
    (``{"max_num_seqs": 256}``; ``tensor_parallel_size`` and ``replicas`` keep the layouts
    with that value: :meth:`~tuner.space.SearchSpace.pinned`, a study of its own);
    ``pin_where`` names, per knob, what the user wrote (``--tensor-parallel-size``), for messages.

    Raises :class:`~tuner.core.errors.InputError` naming the argument (``deployment``,
    ``workload``, ``slo``) that is not what it should be."""

    trace = workload.get("trace") if isinstance(workload, Mapping) else getattr(workload, "trace", None)
    sp = space if isinstance(space, SearchSpace) else load_space(space, trace=trace)
    sp = sp.pinned(pin or {}, pin_where)
    dep = replaced(sp.deployment, deployment, "deployment")
    spec = workload_spec(sp.workload, workload, slo)
    if spec != sp.workload:
        sp = sp.with_workload(spec)
    sp = sp.bind(dep, num_heads(dep))
    return Prepared(sp, requests if requests is not None else build_workload(sp.workload, dep))


def workload_spec(base: WorkloadSpec, workload: WorkloadSpec | Mapping[str, Any] | None,
                  slo: SloSet | str | Sequence[str] | None = None) -> WorkloadSpec:
    """``base`` changed by ``workload`` (a spec, or a dict of changes in which
    ``target_ttft_s`` and ``slos`` are read as one :class:`SloSet`) and ``slo``."""
    if isinstance(workload, Mapping):
        changes = {k: v for k, v in workload.items() if v is not None}  # None: as the space says
        texts, target = changes.pop("slos", None), changes.pop("target_ttft_s", None)
        if isinstance(texts, str):
            texts = [texts]
        if texts is not None or target is not None:
            changes["slo"] = _slo_argument(lambda: SloSet.parse(texts or (), target), "workload").or_target(
                base.target_ttft_s)
        workload = changes
    spec = replaced(base, workload, "workload")
    if slo is not None:
        given = slo if isinstance(slo, SloSet) else _slo_argument(lambda: SloSet.of(slo), "slo")
        spec = dataclasses.replace(spec, slo=given.or_target(spec.target_ttft_s))
    return spec


def _slo_argument(parse: Any, argument: str) -> SloSet:
    """``parse()``, its InputError naming ``argument``."""
    try:
        return parse()
    except InputError as err:
        raise InputError(f"{argument}: {err.message}", argument=argument, hint=err.hint) from err


def backend_for(backend: Backend | str, study: str, options: Mapping[str, Any] | None = None,
                slo: SloSet | None = None) -> Backend:
    """``backend`` made from its name and constructor ``options``, or as given. What its
    constructor takes says what it is told by default: a backend that keeps logs
    (``log_dir``) keeps them in ``studies/<study>/logs``, and one that can record every
    token's gap (``record_itl``) does where an SLO bounds the inter-token latency."""
    if not isinstance(backend, str):
        return backend

    cls = backend_class(backend)
    takes = inspect.signature(cls).parameters
    defaults: dict[str, Any] = {}
    if "log_dir" in takes:
        defaults["log_dir"] = f"studies/{study}/logs"
    if "record_itl" in takes and slo is not None and slo.needs_itl:
        defaults["record_itl"] = True
    return cls(**{**defaults, **(options or {})})


def search(space: str | Path | SearchSpace = "default", *, deployment: Deployment | Mapping[str, Any] | None = None,
           workload: WorkloadSpec | Mapping[str, Any] | None = None, slo: SloSet | str | Sequence[str] | None = None,
           requests: Workload | None = None, backend: Backend | str = "sim",
           backend_options: Mapping[str, Any] | None = None, study: str | None = None, storage: str | None = None,
           settings: SearchSettings | None = None, predict: bool = True, warm_start: bool = False,
           observer: Observer | None = None, tags: Mapping[str, Any] | None = None,
           pin: Mapping[str, Any] | None = None, pin_where: Mapping[str, str] | None = None) -> SearchOutcome:
    """Run (or resume) the study of ``space`` and confirm its winner: :func:`tuner.search`,
    whose docstring says what each argument is (:func:`prepare` reads ``deployment``,
    ``workload``, ``slo``, ``requests`` and ``pin``)."""

    if settings is not None and not isinstance(settings, SearchSettings):
        raise InputError(f"settings must be a SearchSettings, got {type(settings).__name__}", argument="settings",
                         hint="e.g. settings=tuner.SearchSettings(budget=40)")
    s = settings or SearchSettings()
    prepared = prepare(space, deployment=deployment, workload=workload, slo=slo, requests=requests, pin=pin,
                       pin_where=pin_where)
    if isinstance(backend, str):
        backend = backend_for(backend, study or prepared.study_name(backend), backend_options,
                              prepared.space.workload.slo)
    name = study or prepared.study_name(backend.name) + (".goodput" if s.objective == "goodput" else "")
    enqueue = []
    if warm_start and backend.measures_gpu_time:
        observer_or_headless(observer).on_phase("warm start: simulator study")
        enqueue = warm_start_configs(prepared.space, prepared.workload, budget=WARM_START_BUDGET, seed=s.seed,
                                     storage=storage)
    idle = _idle_layouts(prepared.space)
    if idle is not None:
        observer_or_headless(observer).on_warning(idle)
    outcome = run_settings(prepared.space, s, backend=backend, workload=prepared.workload, storage=storage,
                           study=name, enqueue=enqueue, observer=observer, tags=dict(tags or {}),
                           predictor="auto" if predict else None)
    outcome.notes.extend([idle] if idle is not None else _idle_winner(outcome))
    return outcome


def _idle_layouts(space: SearchSpace) -> str | None:
    """One line when every layout the search may run leaves a GPU idle (``--gpus 3
    --tensor-parallel-size 2``): the run goes on, as the GPUs given are the host's, but says so
    before the first trial. None when a layout uses them all."""
    dep = space.deployment
    notes = [dep.idle_note(tp, r) for tp, r in (space.layouts or ((1, dep.gpu_count),))]
    if not notes or not all(notes):
        return None
    said = f"{space.pin_said} on {dep.gpu_count} GPUs" if space.pin_said else f"the space's layouts on {dep.gpu_count} GPUs"  # noqa: E501
    return f"{said}: {'; '.join(notes)} (the study is named for all {dep.gpu_count})"


def _idle_winner(outcome: SearchOutcome) -> list[str]:
    """A note when the winner's layout leaves a GPU idle (the auto layouts of 3 GPUs hold TP2 x 1)."""

    config = None if outcome.best is None else TrialRecord.from_trial(outcome.best).config
    note = None if config is None or outcome.deployment is None else \
        outcome.deployment.idle_note(config.tensor_parallel_size, config.replicas)
    return [] if note is None else [f"the winner, {note}"]


__all__ = ["WARM_START_BUDGET", "Prepared", "backend_for", "prepare", "search"]

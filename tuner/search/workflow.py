"""What ``tuner search`` does, as one call a notebook makes too (``tuner.search(...)``):
the search space read and bound to the deployment, the workload built, the backend made,
a simulator warm start when trials cost GPU time, and the study run.

:func:`prepare` is the first half (space, deployment, workload) that ``tuner nightly``
shares; :func:`search` the whole.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.search.inputs import build_workload, get_backend_by_name, num_heads
from tuner.search.outcome import SearchOutcome
from tuner.search.run import run_search, warm_start_configs
from tuner.search.settings import SearchSettings

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
        from tuner.study import study_name

        return study_name(self.space.deployment, self.workload.fingerprint(), self.space.name, backend,
                          self.space.workload.target_ttft_s, self.space.workload.slo_set().key())


def prepare(space: str | Path | SearchSpace = "default", *, deployment: Mapping[str, Any] | None = None,
            workload: Mapping[str, Any] | None = None, requests: Workload | None = None,
            pin: Mapping[str, Any] | None = None, pin_where: Mapping[str, str] | None = None) -> Prepared:
    """The search space (a shipped name, a YAML file, or a :class:`SearchSpace`) with
    ``deployment`` changes (fields of :class:`~tuner.serving.config.Deployment`: ``model``, ``gpu``,
    ``gpu_count``, ``gpu_ids``, ``quantization``, ``calibration``, ...) and ``workload``
    changes (of its workload section: ``target_ttft_s`` in seconds or as ``"2s"``,
    ``trace``, ``load``, ``requests``, ...; ``None`` leaves a field as the space says),
    bound to the deployment (layouts resolved and checked); ``requests`` replaces the
    workload the space would build. ``pin`` fixes knobs at values (``{"max_num_seqs": 256}``;
    ``tensor_parallel_size`` and ``replicas`` keep the layouts with that value:
    :meth:`~tuner.space.SearchSpace.pinned`, a study of its own); ``pin_where`` names, per
    knob, what the user wrote (``--tensor-parallel-size``), for messages."""
    from tuner.core.units import parse_seconds
    from tuner.serving.slo import split_slos
    from tuner.space import SearchSpace, load_space

    trace = (workload or {}).get("trace")
    sp = space if isinstance(space, SearchSpace) else load_space(space, trace=trace)
    sp = sp.pinned(pin or {}, pin_where)
    dep = dataclasses.replace(sp.deployment, **deployment) if deployment else sp.deployment
    changes = {k: v for k, v in (workload or {}).items() if v is not None}  # None: as the space says
    if "target_ttft_s" in changes:
        changes["target_ttft_s"] = parse_seconds(changes["target_ttft_s"], what="target_ttft_s")
    if "slos" in changes:  # SLO texts; a P95 TTFT one is the target
        ttft, changes["slos"] = split_slos(changes["slos"])
        if ttft is not None:
            changes["target_ttft_s"] = ttft
    if changes:
        sp = sp.with_workload(**changes)
    sp = sp.bind(dep, num_heads(dep))
    return Prepared(sp, requests if requests is not None else build_workload(sp.workload, dep))


#: Constructor options a backend gets by default, from the study's name.
_STUDY_OPTIONS = {"vllm": lambda study: {"log_dir": f"studies/{study}/logs"}}


def backend_for(backend: Backend | str, study: str, options: Mapping[str, Any] | None = None) -> Backend:
    """``backend`` made from its name and constructor ``options`` (a vLLM backend logs to
    ``studies/<study>/logs`` unless told otherwise), or as given."""
    if not isinstance(backend, str):
        return backend
    return get_backend_by_name(backend, **{**_STUDY_OPTIONS.get(backend, lambda _: {})(study), **(options or {})})


def search(space: str | Path | SearchSpace = "default", *, deployment: Mapping[str, Any] | None = None,
           workload: Mapping[str, Any] | None = None, requests: Workload | None = None,
           backend: Backend | str = "sim", backend_options: Mapping[str, Any] | None = None,
           study: str | None = None, storage: str | None = None, settings: SearchSettings | None = None,
           predict: bool = True, warm_start: bool = False, observer: Observer | None = None,
           tags: Mapping[str, Any] | None = None, pin: Mapping[str, Any] | None = None,
           pin_where: Mapping[str, str] | None = None) -> SearchOutcome:
    """Run (or resume) the study of ``space`` (see :func:`prepare` for ``deployment``,
    ``workload``, ``requests`` and ``pin``) on ``backend`` (``sim``, ``vllm`` or ``endpoint`` with
    ``backend_options`` for its constructor, or a backend object) until it holds
    ``settings.budget`` finished trials (:class:`SearchSettings`), and confirm its winner.

    ``study`` defaults to a name made of the deployment, space, workload and target, so
    the same call resumes the same study in ``storage`` (default ``studies/<study>.db``).
    ``predict``: let the simulator guide trials that cost GPU time. ``warm_start``: for a
    backend whose trials cost GPU time, run a simulator study first and try its best
    configurations first. ``observer`` (:class:`~tuner.runtime.progress.Observer`) sees progress;
    ``None`` is headless. Returns the :class:`SearchOutcome`; ``outcome.best`` is the
    recommendation (``None`` when nothing met the target)."""
    from tuner.runtime.progress import observer_or_headless

    s = settings or SearchSettings()
    prepared = prepare(space, deployment=deployment, workload=workload, requests=requests, pin=pin,
                       pin_where=pin_where)
    if isinstance(backend, str):
        if backend == "sim" and any(t.split(":")[1].startswith("itl") for t in prepared.space.workload.slos):
            backend_options = {"record_itl": True, **(backend_options or {})}  # an ITL SLO needs the gaps
        backend = backend_for(backend, study or prepared.study_name(backend), backend_options)
    name = study or prepared.study_name(backend.name) + (".goodput" if s.objective == "goodput" else "")
    enqueue = []
    if warm_start and backend.measures_gpu_time:
        observer_or_headless(observer).on_phase("warm start: simulator study")
        enqueue = warm_start_configs(prepared.space, prepared.workload, budget=WARM_START_BUDGET, seed=s.seed,
                                     storage=storage)
    idle = _idle_layouts(prepared.space)
    if idle is not None:
        observer_or_headless(observer).on_warning(idle)
    outcome = run_search(prepared.space, backend=backend, workload=prepared.workload, storage=storage, study=name,
                         enqueue=enqueue, observer=observer, tags=dict(tags or {}),
                         predictor="auto" if predict else None, **dataclasses.asdict(s))
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
    said = f"{space.pin_said} on {dep.gpu_count} GPUs" if space.pin_said else f"the space's layouts on {dep.gpu_count} GPUs"
    return f"{said}: {'; '.join(notes)} (the study is named for all {dep.gpu_count})"


def _idle_winner(outcome: SearchOutcome) -> list[str]:
    """A note when the winner's layout leaves a GPU idle (the auto layouts of 3 GPUs hold TP2 x 1)."""
    from tuner.study.record import TrialRecord

    config = None if outcome.best is None else TrialRecord.from_trial(outcome.best).config
    note = None if config is None or outcome.deployment is None else \
        outcome.deployment.idle_note(config.tensor_parallel_size, config.replicas)
    return [] if note is None else [f"the winner, {note}"]


__all__ = ["WARM_START_BUDGET", "Prepared", "backend_for", "prepare", "search"]

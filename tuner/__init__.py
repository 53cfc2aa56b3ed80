"""tuner: find the vLLM configuration with the most token throughput under a P95
TTFT target, and plan capacity from it.

The API that the ``tuner`` command and notebooks both call, three plain functions:

* :func:`search` — run or resume a study; returns a ``SearchOutcome``.
* :func:`plan` — how much traffic a study's best configuration holds at the target;
  returns a ``CapacityEstimate``.
* :func:`open_study` — an existing study, to read with :mod:`tuner.study.analysis`.

They take the objects they speak of: a :class:`Deployment` (model, GPU, GPUs), a
:class:`WorkloadSpec` (the traffic a study optimises for) and a :class:`SloSet` (the
service levels it meets). Progress goes to an optional ``observer``
(:class:`tuner.runtime.progress.Observer`); ``None`` shows nothing. Bad input is one
:class:`InputError` that names the argument (``budget must be >= 1, got 0``).

The packages that implement the verbs, :mod:`tuner.search` and :mod:`tuner.plan`, are
loaded here (cheaply: their names are read on first use) before the functions of the same
name are defined, so ``tuner.search`` is the function: ``from tuner.search import
SearchSettings`` still reads the package.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import (
    BackendError,
    ConfigRejected,
    InputError,
    NoFeasibleConfig,
    TunerError,
)
from tuner.serving.config import Deployment, ServeConfig

if TYPE_CHECKING:
    import optuna

    from tuner.plan import Figures, Sweep
    from tuner.runtime.progress import Observer
    from tuner.search import SearchOutcome, SearchSettings
    from tuner.search.backend import Backend
    from tuner.serving.capacity import CapacityEstimate
    from tuner.serving.slo import SloSet
    from tuner.space import SearchSpace
    from tuner.space.workload import WorkloadSpec
    from tuner.traffic.workload import Workload

__version__ = "0.1.0"

# the packages first: importing a package binds its name here once, and never again after
importlib.import_module("tuner.search")
importlib.import_module("tuner.plan")

#: Names of the API read on first use: name -> (module, attribute).
_LAZY = {
    "SearchSettings": ("tuner.search.settings", "SearchSettings"),
    "SearchOutcome": ("tuner.search.outcome", "SearchOutcome"),
    "Sweep": ("tuner.plan.sweep", "Sweep"),
    "Figures": ("tuner.plan.planner", "Figures"),
    "CapacityEstimate": ("tuner.serving.capacity", "CapacityEstimate"),
    "SloSet": ("tuner.serving.slo", "SloSet"),
    "WorkloadSpec": ("tuner.space.workload", "WorkloadSpec"),
    "Observer": ("tuner.runtime.progress", "Observer"),
    "TrialRecord": ("tuner.study.record", "TrialRecord"),
    "StudyRecord": ("tuner.study.record", "StudyRecord"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    return getattr(importlib.import_module(module), attribute)


def search(
    space: str | Path | SearchSpace = "default",
    *,
    deployment: Deployment | Mapping[str, Any] | None = None,
    workload: WorkloadSpec | Mapping[str, Any] | None = None,
    slo: SloSet | str | Sequence[str] | None = None,
    requests: Workload | None = None,
    backend: Backend | str = "sim",
    backend_options: Mapping[str, Any] | None = None,
    study: str | None = None,
    storage: str | None = None,
    settings: SearchSettings | None = None,
    predict: bool = True,
    warm_start: bool = False,
    observer: Observer | None = None,
    tags: Mapping[str, Any] | None = None,
    pin: Mapping[str, Any] | None = None,
) -> SearchOutcome:
    """Run (or resume) the study of ``space`` until it holds ``settings.budget`` finished
    trials, and confirm its winner (what ``tuner search`` does).

    Args:
        space: a shipped space's name (``"default"``), a YAML file, or a ``SearchSpace``.
        deployment: the :class:`Deployment` (model, GPU, GPU count, ...), or a dict of
            changes to the space's (``{"gpu": "H100-SXM", "gpu_count": 8}``).
        workload: the :class:`WorkloadSpec` (trace, load kind, requests, target), or a dict
            of changes to the space's (``{"trace": "logs.jsonl", "target_ttft_s": "2s"}``).
        slo: service levels every chosen load meets: a :class:`SloSet` or SLO texts
            (``["p95:ttft<=2s", "p99:tpot<=30ms"]``); without a P95 TTFT bound, the
            workload's target stays.
        requests: the requests to replay (a ``tuner.traffic.Workload``), instead of those
            the workload builds.
        backend: ``"sim"`` (no GPU), ``"vllm"``, ``"endpoint"``, or a backend object.
        backend_options: its constructor's options, for a backend given by name.
        study: the study's name; by default one made of the deployment, space, workload
            and target, so the same call resumes the same study.
        storage: an Optuna storage URL (default ``studies/<study>.db``).
        settings: how the study measures (``tuner.SearchSettings(budget=40, ...)``).
        predict: let the simulator guide trials that cost GPU time.
        warm_start: for a backend whose trials cost GPU time, try the best configurations
            of a simulator study first.
        observer: sees progress (``None``: headless).
        tags: stamped on every new trial; a measurement is reused only from the same tags.
        pin: knobs fixed at values (``{"max_num_seqs": 256}``), a study of its own.

    Returns:
        The ``SearchOutcome``: ``outcome.best`` is the recommendation (``None`` when no
        configuration met the service levels).

    Raises:
        InputError: an argument that is not what it should be, named
            (``deployment has no field 'gpus'``, ``budget must be >= 1``).
        EnvironmentFault: the machine, not a configuration, failed the run.
    """
    from tuner.search.workflow import search as run

    return run(space, deployment=deployment, workload=workload, slo=slo, requests=requests, backend=backend,
               backend_options=backend_options, study=study, storage=storage, settings=settings, predict=predict,
               warm_start=warm_start, observer=observer, tags=tags, pin=pin)


def plan(
    target_ttft_s: float | str | None = None,
    *,
    study: optuna.Study | str | None = None,
    storage: str | None = None,
    trial: int | None = None,
    config: ServeConfig | None = None,
    deployment: Deployment | Mapping[str, Any] | None = None,
    requests: Workload | None = None,
    slo: SloSet | str | Sequence[str] | None = None,
    backend: Backend | str = "sim",
    backend_options: Mapping[str, Any] | None = None,
    sweep: Sweep | None = None,
    figures: Figures | None = None,
    store: bool = True,
    observer: Observer | None = None,
    workload: Workload | None = None,
    slos: Sequence[str] | None = None,
) -> CapacityEstimate:
    """How much traffic one configuration holds at a P95 TTFT target (what ``tuner plan``
    does): its load swept on ``backend``, the most it holds within the target.

    Args:
        target_ttft_s: the P95 TTFT target, seconds or ``"5s"``; default the study's.
        study: an Optuna study or a study name in ``storage``; default the newest study.
        storage: an Optuna storage URL.
        trial: the study's trial to plan; default its best feasible trial.
        config: a :class:`ServeConfig` to plan instead of a study's trial.
        deployment: the :class:`Deployment` of ``config`` (or a dict of changes to the
            default ``Deployment()``).
        requests: the requests to replay; default the study's.
        slo: service levels besides the target (a :class:`SloSet` or SLO texts; a P95
            TTFT one is the target); default the study's.
        backend: ``"sim"``, ``"vllm"``, ``"endpoint"``, or a backend object.
        backend_options: its constructor's options, for a backend given by name.
        sweep: how the load is swept (``tuner.Sweep(levels=(1, 2, 4))``).
        figures: what the capacity means (``tuner.Figures(demand="1200/min")``).
        store: keep the estimate in the study.
        observer: sees each phase (``None``: headless).
        workload: the old name of ``requests``.
        slos: the old name of ``slo``, as SLO texts.

    Returns:
        The ``CapacityEstimate``.

    Raises:
        InputError: an argument that is not what it should be, named; no such study or
            trial; the study's workload cannot be rebuilt.
        NoFeasibleConfig: no feasible trial, or even the lowest load misses the target.
        ConfigRejected: the configuration does not start.
    """
    from tuner.core.values import replaced
    from tuner.plan.planner import Figures, plan_capacity
    from tuner.plan.sweep import Sweep
    from tuner.serving.slo import SloSet

    _check_type(sweep, Sweep, "sweep", "tuner.Sweep(levels=(1, 2, 4))")
    _check_type(figures, Figures, "figures", 'tuner.Figures(demand="1200/min")')
    _check_type(config, ServeConfig, "config", "tuner.ServeConfig(max_num_seqs=64)")
    if requests is not None and workload is not None:
        raise InputError("give requests or workload (its old name), not both", argument="requests")
    if slo is not None and slos is not None:
        raise InputError("give slo or slos (its old name), not both", argument="slo")
    dep = None if deployment is None else replaced(Deployment(), deployment, "deployment")
    texts = slos if slo is None else SloSet.of(slo).texts
    return plan_capacity(target_ttft_s, study=study, storage=storage, trial=trial, config=config, deployment=dep,
                         workload=requests if requests is not None else workload, backend=backend,
                         backend_options=backend_options, sweep=sweep or Sweep(), figures=figures or Figures(),
                         store=store, observer=observer, slos=None if texts is None else list(texts))


def open_study(path_or_name: str | Path, storage: str | None = None) -> optuna.Study:
    """An existing study, read only in spirit (nothing is written); read it with
    :mod:`tuner.study.analysis`.

    Args:
        path_or_name: a SQLite file (``studies/NAME.db``), a storage URL
            (``sqlite:///x.db``, ``postgresql://...``), or a study name.
        storage: where a study given by name is (default ``studies/NAME.db``).

    Returns:
        The ``optuna.Study``.

    Raises:
        InputError: no such study; the message names what exists.
    """
    from tuner.study.analysis import open_study as opened

    return opened(path_or_name, storage)


def _check_type(value: object, kind: type, argument: str, example: str) -> None:
    """One :class:`InputError` naming ``argument`` when ``value`` is neither ``None`` nor a ``kind``."""
    if value is not None and not isinstance(value, kind):
        raise InputError(f"{argument} must be a {kind.__name__}, got {type(value).__name__}", argument=argument,
                         hint=f"e.g. {argument}={example}")


__all__ = [
    "BackendError",
    "CapacityEstimate",
    "ConfigRejected",
    "Deployment",
    "Figures",
    "InputError",
    "NoFeasibleConfig",
    "Observer",
    "SearchOutcome",
    "SearchSettings",
    "ServeConfig",
    "SloSet",
    "StudyRecord",
    "Sweep",
    "TrialRecord",
    "TunerError",
    "WorkloadSpec",
    "__version__",
    "open_study",
    "plan",
    "search",
]

"""Running a study: :func:`run_search` (a :class:`~tuner.search.driver.SearchRun` of its settings)
and :func:`warm_start_configs`."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.runtime.progress import Observer
from tuner.search.driver import SearchRun
from tuner.search.goodput import EDGE_TOLERANCE, MAX_REPLAYS
from tuner.search.outcome import SearchOutcome
from tuner.search.settings import CONFIRM_MAX_ROUNDS, CONFIRM_ROUNDS, SearchSettings
from tuner.search.setup import open_search
from tuner.serving.config import ServeConfig
from tuner.study import top_feasible_trials, trial_config
from tuner.study.race import FEASIBILITY
from tuner.study.storage import guard_storage

if TYPE_CHECKING:
    from tuner.search.backend import Backend
    from tuner.search.prediction import Predictor
    from tuner.space import SearchSpace
    from tuner.traffic.workload import Workload


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
    observer: Observer | None = None,
    tags: dict[str, Any] | None = None,
    predictor: Predictor | str | None = "auto",
    kill_stale: bool = False,
    confirm: int = CONFIRM_ROUNDS,
    confirm_max: int = CONFIRM_MAX_ROUNDS,
    edge_tolerance: float = EDGE_TOLERANCE,
    objective: str = "tokens",
    feasibility: float = FEASIBILITY,
    resume_anyway: bool = False,
    start_refused: bool = False,
) -> SearchOutcome:
    """Run (or resume) the study for ``space`` until it holds ``budget`` finished trials
    or ``timeout_s`` passes. ``space`` must be bound (:meth:`SearchSpace.bind`); a
    ``precheck`` is always the simulator's memory planner when the backend has one.
    Several processes may run it on one server-database study (:mod:`tuner.study.workers`:
    the budget is global). ``tags`` are stamped on every new trial, and a configuration
    is only reused from a trial with the same tags and workload.

    ``predictor`` (:mod:`tuner.search.prediction`): ``"auto"`` uses the simulator for a
    backend that starts the configuration on real GPUs (``restarts`` and
    ``measures_gpu_time``: vLLM) when it can model the deployment (a trial then starts its goodput search
    at the predicted load, and a configuration predicted below ``PRUNE_SHARE`` of the best
    is pruned without a launch); ``None`` turns it off; or a :class:`Predictor`.

    Trials that measure nothing (:mod:`tuner.study.recovery`) — interrupted by a signal or by
    ``timeout_s`` (which also cuts a hung start or replay), or failed by the environment
    — do not use the budget and are queued again when the study resumes; two
    environment faults in a row stop the run (:class:`EnvironmentFault`). Servers a
    dead run left behind are reported through ``observer.on_warning`` and stopped only
    with ``kill_stale``.

    Every trial replays the same requests in the same order with the same arrival seed
    (common random numbers: differences between trials are the configurations', not the
    sample's). Once the budget is spent, the configurations within the noise band of the
    best are measured ``confirm`` more times each on new samples (and up to
    ``confirm_max`` times while one that differs from the leader in a knob that changes
    speed is still tied with it), and the study's recommendation is made on those repeats
    (:mod:`tuner.study.race`); ``confirm=0`` turns that off. ``edge_tolerance``: how close the passing and failing loads of a
    trial must come (share of the load, closed loop at least one user). ``objective``: what a
    trial scores at its edge, ``tokens`` (tokens/s) or ``goodput`` (requests/s meeting every SLO,
    as ``vllm bench serve --goodput``; a study of its own, named ``....goodput``). ``start_refused``:
    a configuration the memory planner predicts vLLM will refuse for memory is started anyway and
    the start judges the prediction (:mod:`tuner.search.refusal`)."""  # noqa: E501
    settings = SearchSettings(budget=budget, timeout_s=timeout_s, sampler=sampler, seed=seed, precheck=precheck,
                              early_stop=early_stop, max_replays=max_replays, confirm=confirm,
                              confirm_max=confirm_max, edge_tolerance=edge_tolerance, kill_stale=kill_stale,
                              objective=objective, feasibility=feasibility, resume_anyway=resume_anyway,
                              start_refused=start_refused)
    return run_settings(space, settings, backend=backend, workload=workload, storage=storage, study=study,
                        enqueue=enqueue, observer=observer, tags=tags, predictor=predictor)


@guard_storage
def run_settings(space: SearchSpace, settings: SearchSettings, *, backend: Backend | str = "sim",
                 workload: Workload | None = None, storage: str | None = None, study: str | None = None,
                 enqueue: Sequence[ServeConfig] = (), observer: Observer | None = None,
                 tags: dict[str, Any] | None = None, predictor: Predictor | str | None = "auto") -> SearchOutcome:
    """:func:`run_search` with its measuring options as one :class:`SearchSettings`, handed
    whole to the opened run (:func:`~tuner.search.setup.open_search`) and its trials."""
    setup = open_search(space, backend, workload, storage, study, settings, enqueue=enqueue, observer=observer,
                        tags=tags, predictor=predictor)
    return SearchRun(setup).run()


def warm_start_configs(space: SearchSpace, workload: Workload, *, k: int = 3, budget: int = 40,
                       seed: int = 0, storage: str | None = None, observer: Observer | None = None,
                       ) -> list[ServeConfig]:
    """Run (or reuse) a simulator study of the same space and workload and return its
    ``k`` best feasible configurations, to enqueue as the first real trials."""

    outcome = run_search(space, backend="sim", workload=workload, budget=budget, seed=seed,
                         storage=storage, observer=observer)
    return [trial_config(t) for t in top_feasible_trials(outcome.study, k)]

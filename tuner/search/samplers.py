"""The Optuna samplers a study may use."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import optuna
    from optuna.trial import FrozenTrial

    from tuner.space import SearchSpace

SAMPLERS = ("tpe", "gp", "random", "grid")


#: Trials before TPE/GP model the space (vLLM's defaults per layout count among them).
#: 5 beat 3, 4 and 8 at 15 trials on benchmarks/search_quality.py's seeds 10-39; the
#: benchmark reports seeds 0-9.
N_STARTUP_TRIALS = 5


def _grid(cls: type) -> type:
    """Optuna's grid sampler, safe for the trials tuner queues itself (the retry of a trial a
    signal or a kill stopped, last night's best): those carry no ``grid_id``, and Optuna's
    ``after_trial`` looks it up when one grid point is left unvisited, raising KeyError. A grid
    study resumed after Ctrl-C then crashed with exit 1 whenever the stop fell on its
    second-to-last point (tests/faults, seen under load, where the signal lands later).
    Without a ``grid_id`` the trial cannot be the last point, so the study is not stopped."""

    class Grid(cls):  # type: ignore[misc, valid-type]
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            try:
                super().after_trial(study, trial, state, values)
            except KeyError:
                pass  # a queued trial: the one unvisited point is still to be measured

    Grid.__name__ = Grid.__qualname__ = cls.__name__
    return Grid


def make_sampler(name: str, *, seed: int | None, space: SearchSpace | None = None,
                 constraints_func: Callable[[FrozenTrial], Sequence[float]] | None = None,
                 ) -> optuna.samplers.BaseSampler:
    """TPE with constraints (default), GP with constraints, random, or grid over the
    space's discretised version. A model sampler fits the study's trials as they are: the
    confirmation's repeats are kept in the study's companion (:func:`tuner.study.confirmation_study`),
    so a race's 10-30 repeats of the few best never fill TPE's "good" group with copies of one
    region (benchmarks/search_noise.py, V100 family). ``constraints_func`` (TPE and GP: what a
    finished trial's constraints are, :func:`tuner.search.constraints.sampler_constraints`) has
    Optuna write them as the list its samplers and optuna-dashboard read."""
    import warnings

    import optuna

    name = name.lower()
    with warnings.catch_warnings():  # Optuna 5 announces constraints_func's removal in 7.0 (tuner.search.constraints)
        warnings.filterwarnings("ignore", message=".*constraints_func.*", category=FutureWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=N_STARTUP_TRIALS,
                                              constraints_func=constraints_func)
        if name == "gp":
            try:
                import torch  # noqa: F401  (GPSampler's dependency)
            except ImportError as err:
                raise InputError("the GP sampler needs PyTorch", hint="pip install torch, or use --sampler tpe") from err  # noqa: E501
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=N_STARTUP_TRIALS,
                                             constraints_func=constraints_func)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if space is None:
            raise InputError("the grid sampler needs a search space")
        return _grid(optuna.samplers.GridSampler)(space.grid(), seed=seed)
    raise InputError(f"unknown sampler {name!r}", hint=f"use one of {', '.join(SAMPLERS)}")

"""The Optuna samplers a study may use."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from tuner.errors import InputError

if TYPE_CHECKING:
    import optuna

    from tuner.space import SearchSpace

SAMPLERS = ("tpe", "gp", "random", "grid")


#: Trials before TPE/GP model the space (vLLM's defaults per layout count among them).
#: 5 beat 3, 4 and 8 at 15 trials on benchmarks/search_quality.py's seeds 10-39; the
#: benchmark reports seeds 0-9.
N_STARTUP_TRIALS = 5


class _SearchTrials:
    """A study seen without its confirmation repeats (``confirm_of`` set): what a model
    sampler fits. A repeat re-measures a configuration the search already proposed;
    counted as new trials, a race's 10-30 repeats of the few best would fill TPE's
    "good" group with copies of one region and stop it exploring when the study is
    resumed (benchmarks/search_noise.py, V100 family). Optuna has no public trial
    filter for samplers, so the view overrides ``Study._get_trials``, which TPE and GP
    read their history through."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, *args: Any, **kwargs: Any) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self._study._get_trials(*args, **kwargs) if t.user_attrs.get("confirm_of") is None]

    def get_trials(self, *args: Any, **kwargs: Any) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self._study.get_trials(*args, **kwargs) if t.user_attrs.get("confirm_of") is None]


@functools.cache
def _blind_to_repeats(cls: type) -> type:
    """``cls`` (an Optuna sampler class) whose model sees a study without its
    confirmation repeats (:class:`_SearchTrials`)."""

    class Sampler(cls):  # type: ignore[misc,valid-type]
        def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
            return super().infer_relative_search_space(_SearchTrials(study), trial)

        def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
            return super().sample_relative(_SearchTrials(study), trial, search_space)

        def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
            return super().sample_independent(_SearchTrials(study), trial, param_name, param_distribution)

    Sampler.__name__ = Sampler.__qualname__ = cls.__name__
    return Sampler


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


def make_sampler(name: str, *, seed: int | None, space: SearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """TPE with constraints (default), GP with constraints, random, or grid over the
    space's discretised version."""
    import optuna

    name = name.lower()
    if name == "tpe":
        return _blind_to_repeats(optuna.samplers.TPESampler)(seed=seed, n_startup_trials=N_STARTUP_TRIALS)
    if name == "gp":
        try:
            import torch  # noqa: F401  (GPSampler's dependency)
        except ImportError as err:
            raise InputError("the GP sampler needs PyTorch", hint="pip install torch, or use --sampler tpe") from err
        return _blind_to_repeats(optuna.samplers.GPSampler)(seed=seed, n_startup_trials=N_STARTUP_TRIALS)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if space is None:
            raise InputError("the grid sampler needs a search space")
        return _grid(optuna.samplers.GridSampler)(space.grid(), seed=seed)
    raise InputError(f"unknown sampler {name!r}", hint=f"use one of {', '.join(SAMPLERS)}")

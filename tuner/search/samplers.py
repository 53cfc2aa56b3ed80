"""The Optuna samplers a study may use, and what they learn from."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import optuna

from tuner.errors import InputError

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.trial import FrozenTrial

    from tuner.space import SearchSpace

SAMPLERS = ("tpe", "gp", "random", "grid")


#: Trials before TPE/GP model the space (vLLM's defaults per layout count among them).
#: 5 beat 3, 4 and 8 at 15 trials on benchmarks/search_quality.py's seeds 10-39; the
#: benchmark reports seeds 0-9.
N_STARTUP_TRIALS = 5


def searched(trial: FrozenTrial) -> bool:
    """Whether ``trial`` is one of the search's own measurements: not a copy of an earlier
    trial (``repeat_of``: its value is already there once) and not a confirmation repeat
    (``confirm_of``: measured on another sample of the requests)."""
    attrs = trial.user_attrs
    return attrs.get("repeat_of") is None and attrs.get("confirm_of") is None


class _SearchedTrials:
    """A study as a model-based sampler should see it: every trial but copies and
    confirmation repeats (:func:`searched`); the rest is the study's."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[FrozenTrial]:
        trials = self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
        return [t for t in trials if searched(t)]

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        return [t for t in self._study.get_trials(deepcopy=deepcopy, states=states) if searched(t)]

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()


class SearchedOnly(optuna.samplers.BaseSampler):
    """A model-based sampler (TPE, GP) that learns from the search's own measurements only.

    All of a study's trials replay one sample of the requests (common random numbers), so
    their values compare. A confirmation repeat measures a configuration on another sample
    (the requests reordered): on the V100 family of benchmarks/search_noise.py the best
    configurations read about 9 % lower on it, so a sampler that saw the repeats learnt
    that the region it had just confirmed was worse and left it. A copy of an earlier
    trial (a configuration proposed again) adds its value a second time, so the sampler
    weights it more and proposes it again. With both in view TPE@40 met the V100 family's
    best region (12 of 120 configurations) in 8 of 10 seeds; with neither, in 10 of 10.
    Optuna has no option to leave trials out of a sampler's view: the study handed to the
    inner sampler is filtered (:class:`_SearchedTrials`); it reads trials through
    ``Study._get_trials``, which the filter overrides."""

    def __init__(self, inner: optuna.samplers.BaseSampler) -> None:
        self.inner = inner

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(_SearchedTrials(study), trial)  # type: ignore[arg-type]

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self.inner.sample_relative(_SearchedTrials(study), trial, search_space)  # type: ignore[arg-type]

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(_SearchedTrials(study), trial, param_name,  # type: ignore[arg-type]
                                             param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: Any, values: Any) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


def make_sampler(name: str, *, seed: int | None, space: SearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """TPE with constraints (default), GP with constraints, random, or grid over the
    space's discretised version. TPE and GP learn from the search's own measurements
    only (:class:`SearchedOnly`)."""
    name = name.lower()
    if name == "tpe":
        return SearchedOnly(optuna.samplers.TPESampler(seed=seed, n_startup_trials=N_STARTUP_TRIALS))
    if name == "gp":
        try:
            import torch  # noqa: F401  (GPSampler's dependency)
        except ImportError as err:
            raise InputError("the GP sampler needs PyTorch", hint="pip install torch, or use --sampler tpe") from err
        return SearchedOnly(optuna.samplers.GPSampler(seed=seed, n_startup_trials=N_STARTUP_TRIALS))
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if space is None:
            raise InputError("the grid sampler needs a search space")
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    raise InputError(f"unknown sampler {name!r}", hint=f"use one of {', '.join(SAMPLERS)}")

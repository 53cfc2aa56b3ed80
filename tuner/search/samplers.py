"""The Optuna samplers a study may use, and what they learn from."""
from __future__ import annotations

import copy
import math
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


def _order_effects(trials: list[FrozenTrial]) -> dict[int, float]:
    """Per confirmation round, the factor by which that round's order of the requests moved
    every configuration measured on it: the geometric mean of repeat / first measurement
    over the round's repeats (every round r of a study replays the same reordered sample,
    so its repeats share one order). Rounds with fewer than two such pairs are left out."""
    first = {t.number: t.value for t in trials if t.value}
    logs: dict[int, list[float]] = {}
    for t in trials:
        attrs = t.user_attrs
        of, r = attrs.get("confirm_of"), attrs.get("confirm_round")
        if of is not None and r is not None and t.value and first.get(int(of)):
            logs.setdefault(int(r), []).append(math.log(t.value / first[int(of)]))
    return {r: math.exp(sum(v) / len(v)) for r, v in logs.items() if len(v) >= 2}


def searched(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials a model-based sampler should learn from: the search's own measurements,
    and the confirmation repeats brought to their sample's scale (:func:`_order_effects`;
    a repeat whose round has no estimate, and copies of an earlier trial, left out). A
    repeat that failed the target stays a failure: the configuration does not hold on
    every order of the requests."""
    effects: dict[int, float] | None = None
    out = []
    for t in trials:
        attrs = t.user_attrs
        if attrs.get("repeat_of") is not None:
            continue
        if attrs.get("confirm_of") is not None and t.value:
            if effects is None:
                effects = _order_effects(trials)
            factor = effects.get(int(attrs.get("confirm_round") or 0))
            if factor is None:
                continue
            t = copy.copy(t)
            t.value = t.value / factor
        out.append(t)
    return out


class _SearchedTrials:
    """A study as a model-based sampler should see it (:func:`searched`); the rest is the
    study's."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[FrozenTrial]:
        return searched(self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache))

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        return searched(self._study.get_trials(deepcopy=deepcopy, states=states))

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()


class SearchedOnly(optuna.samplers.BaseSampler):
    """A model-based sampler (TPE, GP) that learns from the search's own measurements, and
    from confirmation repeats only on the same scale.

    All of a study's trials replay one sample of the requests (common random numbers), so
    their values compare. A confirmation repeat measures a configuration on another order
    of the requests: on the V100 family of benchmarks/search_noise.py every configuration
    read about 9 % lower on it, so a sampler that saw the raw repeats learnt that the
    region it had just confirmed was worse and left it. Divided by its order's common
    factor, a repeat still says what it should: that a configuration holds up on other
    orders or not (on the bursty H200 family a 16k batched-token budget is the best on the
    logged order and 10-35 % under on others). A copy of an earlier trial (a configuration
    proposed again) would add its value a second time, so the sampler would weight it
    more and propose it again: left out. Optuna has no option to change what a sampler
    sees: the study handed to the inner sampler is a filtered view
    (:class:`_SearchedTrials`); Optuna's samplers read trials through
    ``Study._get_trials``, which the view overrides."""
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
    and the confirmation repeats on their scale (:class:`SearchedOnly`)."""
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

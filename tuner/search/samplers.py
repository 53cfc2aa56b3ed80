"""The Optuna samplers a study may use."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.errors import InputError

if TYPE_CHECKING:
    import optuna

    from tuner.space import SearchSpace

SAMPLERS = ("tpe", "gp", "random", "grid")


#: Trials before TPE/GP model the space (vLLM's defaults per layout count among them).
#: 5 beat 3, 4 and 8 at 15 trials on benchmarks/search_quality.py's seeds 10-39; the
#: benchmark reports seeds 0-9.
N_STARTUP_TRIALS = 5


def make_sampler(name: str, *, seed: int | None, space: SearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """TPE with constraints (default), GP with constraints, random, or grid over the
    space's discretised version."""
    import optuna

    name = name.lower()
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=N_STARTUP_TRIALS)
    if name == "gp":
        try:
            import torch  # noqa: F401  (GPSampler's dependency)
        except ImportError as err:
            raise InputError("the GP sampler needs PyTorch", hint="pip install torch, or use --sampler tpe") from err
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=N_STARTUP_TRIALS)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if space is None:
            raise InputError("the grid sampler needs a search space")
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    raise InputError(f"unknown sampler {name!r}", hint=f"use one of {', '.join(SAMPLERS)}")

"""The time window of a run (``--timeout``): how long a trial of this study takes, so that
none is started that the window cannot hold (its GPU time would be thrown away).

A trace too large for one trial in the window is sampled, with one line
(:func:`fit_to_window`): replayed whole, no trial would ever finish in it, and every
rerun would stop at the window with nothing measured.

The estimate is the study's own: the longest finished trial that started a server (its
start, goodput search and stop; copies of a measurement and pre-check refusals took no
server). Before any trial did, there is nothing to go by and the trial starts (a cut one is
measured again when the study resumes).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.search.blame import started
from tuner.serving.config import ServeConfig
from tuner.serving.load import Concurrency
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    import optuna

    from tuner.space.search_space import SearchSpace
    from tuner.traffic.workload import Workload


def trial_estimate(study: optuna.Study) -> float | None:
    """Wall seconds the study's longest finished trial that started a server took (its
    start, goodput search and stop); None before any did."""
    from optuna.trial import TrialState

    took = [t.duration.total_seconds() for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.duration is not None and started(TrialRecord.from_trial(t))
            and TrialRecord.from_trial(t).repeat_of is None]
    return max(took) if took else None


#: Of the window (``--timeout``), what one trial's replays may take before the trace is sampled:
#: half, since the pilot is timed once and a host as busy again runs the trial at half its speed.
TRIAL_SHARE = 0.5
#: Requests a pilot replays to time the embedded simulator, and the fewest a sample keeps.
PILOT, MIN_SAMPLE = 2000, 200


def replay_cost(backend: Any, deployment: Any, workload: Workload, study: optuna.Study,
                space: SearchSpace | None = None) -> float | None:
    """Wall seconds one request of ``workload`` costs a replay: timed on a pilot of
    :data:`PILOT` requests for a backend that costs no GPU time (the embedded simulator),
    on the space's costliest configuration to simulate (:func:`costliest`), else the
    slowest load of the study's own measured trials; None when nothing tells."""
    if not backend.measures_gpu_time:
        config = costliest(space)
        pilot = workload.take(slice(0, min(PILOT, len(workload))))
        t0 = time.perf_counter()
        with backend.start(deployment, config) as inst:
            inst.run(pilot, Concurrency(config.max_num_seqs or 256))
        return (time.perf_counter() - t0) / len(pilot)
    costs = [p.duration_s / rec.run.workload_requests for rec in map(TrialRecord.from_trial, study.get_trials(
        deepcopy=False)) for p in rec.loads if p.duration_s and rec.run.workload_requests]
    return max(costs) if costs else None


def costliest(space: SearchSpace | None) -> ServeConfig:
    """The configuration of ``space`` the simulator takes longest to replay a request on: its
    fewest sequences a step (every step costs about the same wall time, and a batch of 16
    needs 16 times the steps of one of 256); vLLM's defaults without a space."""

    if space is None:
        return ServeConfig()
    lows = [min(p.choices) if p.choices else p.low for p in space.params if p.name == "max_num_seqs"]
    fixed = dict(space.fixed).get("max_num_seqs")
    fewest = int(lows[0]) if lows else fixed
    return ServeConfig() if fewest is None else ServeConfig(max_num_seqs=int(fewest))


def fit_to_window(workload: Workload, window_s: float | None, max_replays: int, seed: int,
                  cost: Callable[[], float | None]) -> tuple[Workload, str | None]:
    """``workload``, or a seeded random sample of it a trial can replay ``max_replays``
    times within :data:`TRIAL_SHARE` of ``window_s`` (a round count: 1, 2 or 5 x 10^k), with
    the line that says so; ``cost()`` (:func:`replay_cost`) is asked only for a window and a
    workload larger than :data:`MIN_SAMPLE`. :class:`InputError` when not even that many fit."""
    import math

    import numpy as np

    if window_s is None or len(workload) <= MIN_SAMPLE or (per := cost()) is None:
        return workload, None
    per_load = per * len(workload)
    if per_load * max_replays <= TRIAL_SHARE * window_s:
        return workload, None
    fits = TRIAL_SHARE * window_s / (per * max_replays)
    if fits < MIN_SAMPLE:
        raise InputError(f"--timeout {window_s:g} s cannot hold one trial: even {MIN_SAMPLE} of the trace's requests "
                         f"take about {MIN_SAMPLE * per * max_replays:.0f} s to replay {max_replays} times",
                         hint="give --timeout more time")
    k = 10 ** math.floor(math.log10(fits))
    n = max(m * k for m in (1, 2, 5) if m * k <= fits)
    rows = np.sort(np.random.default_rng(seed).choice(len(workload), n, replace=False))
    return workload.take(rows, rebase=False), (
        f"the trace holds {len(workload):,} requests: replaying them all would take about {_secs(per_load)} s a load, "
        f"up to {max_replays} loads a trial, more than --timeout {window_s:g} s holds; each load replays {n:,} of "
        f"them drawn at random (seed {seed}), of the same shape (give --timeout more time, or cut the log with tuner "
        "trace convert, to replay more)")


def _secs(x: float) -> str:
    """Seconds as a reader wants them: 143, 3.2, 0.41."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


__all__ = ["costliest", "fit_to_window", "replay_cost", "trial_estimate"]

"""Multi-step decode runs: :func:`plan_run` plans a run of decode-only steps at once, and
:func:`truncated` cuts a planned one short; :class:`~tuner.sim.scheduler.engine_core.EngineCore`
applies it.

When nothing can change for a while (all running requests decode, none finishes, no block
runs out, nobody can be admitted and no outside event is due)
:meth:`EngineCore.advance` jumps over ``k`` decode steps at once: their durations come from
:meth:`StepTimer.decode_run` and are identical to stepping.

A run is the tuple ``(start, k, k_fin, durations, cumulative, remaining)``: it starts at
``start`` and takes ``k`` steps, ``k_fin`` of which end the first requests (``remaining``
tokens each to go), step ``i`` ending at ``start + cumulative[i]``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tuner.sim.scheduler.policy import COMPUTED, PRIVATE, REQ, SHARED, TOKENS, UNPUBLISHED, Scheduler

if TYPE_CHECKING:
    from tuner.sim.steptime import StepTimer

Run = tuple[float, int, int, np.ndarray, np.ndarray, np.ndarray]


def _steps_with_blocks(computed: np.ndarray, held: np.ndarray, block_size: int, free: int, most: int) -> int:
    """The most decode steps (up to ``most``) whose new blocks fit in ``free``."""
    def need(k: int) -> np.ndarray:
        return np.maximum(-(-(computed + k) // block_size) - held, 0)

    if int(need(most).sum()) <= free:
        return most
    lo, hi = 0, most        # need(lo) fits, need(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if int(need(mid).sum()) <= free:
            lo = mid
        else:
            hi = mid
    return lo


def plan_run(scheduler: Scheduler, timer: StepTimer, now: float, horizon_s: float) -> Run | None:
    """The decode run the batch of ``scheduler`` may take from ``now``, ending at the first
    step boundary at or after ``now + horizon_s``; None when the next step is not one of
    many decode-only steps (a prefill, a finish or a block shortage within two steps, or a
    request that could be admitted)."""
    batch = scheduler.batch
    n = batch.shape[1]
    if n == 0 or n > scheduler.budget:
        return None
    computed = batch[COMPUTED]
    if int((batch[TOKENS] - computed).max()) != 1 or (scheduler.pending and batch[UNPUBLISHED].any()):
        return None
    if not scheduler.admission_blocked(n):
        return None
    reqs, table = batch[REQ], scheduler.requests
    remaining = table.max_out[reqs] - table.out[reqs]
    k_fin = int(remaining.min())
    most = _steps_with_blocks(computed, batch[SHARED] + batch[PRIVATE], scheduler.bs, scheduler.pool.free, k_fin)
    if most < 2:
        return None
    durations = timer.decode_run(n, float(computed.sum()), most)
    cum = np.cumsum(durations)
    k = most
    if horizon_s < cum[-1]:
        k = min(int(np.searchsorted(cum, horizon_s, side="left")) + 1, most)
    return (now, k, k_fin, durations, cum, remaining)


def truncated(run: Run, t: float) -> Run:
    """``run`` cut at the first step boundary at or after ``t`` (a request arrived that
    could be admitted then)."""
    start, k, k_fin, durations, cum, remaining = run
    k2 = min(k, int(np.searchsorted(cum, t - start, side="left")) + 1)
    return (start, max(1, k2), k_fin, durations, cum, remaining)

"""Multi-step decode runs (:class:`DecodeRuns`, mixed into
:class:`~tuner.sim.scheduler.engine_core.EngineCore`): planning, cutting and applying a
run of decode-only steps at once.

Per-request state of the running batch lives in numpy arrays, so a step costs a few dozen
vector operations however many requests run. When nothing can change for a while (all
running requests decode, none finishes, no block runs out, nobody can be admitted and no
outside event is due) :meth:`EngineCore.advance` jumps over ``k`` decode steps at once:
their durations come from :meth:`StepTimer.decode_run` and are identical to stepping.
"""
from __future__ import annotations

import numpy as np

from tuner.sim.scheduler.steps import _EMPTY, Advance


class DecodeRuns:
    """The decode-run fast path; a mixin of
    :class:`~tuner.sim.scheduler.engine_core.EngineCore`, whose state it reads and moves."""

    def _admission_blocked(self, n_running: int) -> bool:
        if not self.waiting or n_running >= self.max_seqs or self.budget - n_running <= 0:
            return True
        head = self.waiting[0]
        b = self._blocked
        if b is not None and b[0] == head and b[2] == self._pool_version and self.pool.free <= b[1]:
            return True
        ok = self._fits(head)[0]
        if not ok:
            self._blocked = (head, self.pool.free, self._pool_version)
        return not ok

    def _try_decode_run(self, horizon_s: float, defer: bool = False) -> Advance | None:
        R = self.R
        n = R.shape[1]
        if n == 0 or n > self.budget:
            return None
        comp = R[self.COMP]
        ntok = R[self.NTOK]
        if int((ntok - comp).max()) != 1 or (self.pending and R[self.PUB].any()):
            return None
        if not self._admission_blocked(n):
            return None
        idx = R[self.IDX]
        remaining = self.max_out[idx] - self.out[idx]
        k_fin = int(remaining.min())
        kmax = k_fin
        held = R[self.S] + R[self.P]
        bs = self.bs
        free = self.pool.free

        def need(k: int) -> np.ndarray:
            return np.maximum(-(-(comp + k) // bs) - held, 0)

        if int(need(kmax).sum()) > free:
            lo, hi = 0, kmax        # need(lo) fits, need(hi) does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if int(need(mid).sum()) <= free:
                    lo = mid
                else:
                    hi = mid
            kmax = lo
        if kmax < 2:
            return None
        durs = self.timer.decode_run(n, float(comp.sum()), kmax)
        cum = np.cumsum(durs)
        k = kmax
        if horizon_s < cum[-1]:
            k = min(int(np.searchsorted(cum, horizon_s, side="left")) + 1, kmax)
        self._run = (self.now, k, k_fin, durs, cum, remaining)
        if not defer:
            return Advance(self.now + float(cum[k - 1]), k, self.commit_run())
        return Advance(self.now + float(cum[k - 1]), k, _EMPTY, deferred=True)

    @property
    def commit_pending(self) -> bool:
        """A deferred step or decode run waits for :meth:`commit`."""
        return self._run is not None or self._emit is not None

    @property
    def run_pending(self) -> bool:
        """A deferred decode run is planned but not yet applied (see :meth:`advance`)."""
        return self._run is not None

    def truncate_run(self, t: float) -> float:
        """Cut the pending run at the first step boundary at or after ``t`` (a request
        arrived that could be admitted then); returns the run's new end time."""
        start, k, k_fin, durs, cum, remaining = self._run
        k2 = min(k, int(np.searchsorted(cum, t - start, side="left")) + 1)
        self._run = (start, max(1, k2), k_fin, durs, cum, remaining)
        return start + float(cum[max(1, k2) - 1])

    def commit_run(self) -> np.ndarray:
        """Apply the pending decode run; returns the requests that finished at its end."""
        start, k, k_fin, durs, cum, remaining = self._run
        self._run = None
        R = self.R
        n = R.shape[1]
        idx = R[self.IDX]
        comp = R[self.COMP]
        newb = np.maximum(-(-(comp + k) // self.bs) - R[self.S] - R[self.P], 0)
        self.pool.allocate(int(newb.sum()))
        R[self.P] += newb
        R[self.COMP] += k
        R[self.NTOK] += k
        self.out[idx] += k
        self.generation_tokens += n * k
        end = start + float(cum[k - 1])
        seen = self._deliver_run(start + cum[:k], n)   # when users get each step's tokens
        first = np.isnan(self.t_first[idx])    # a prompt whose last token is computed now
        if first.any():
            self.t_first[idx[first]] = seen[0]
        if self.record_itl:
            gaps = seen[0] - self.t_last[idx]
            self.itl_chunks.append(gaps[~first])
            if k > 1:
                self.itl_chunks.append(np.repeat(np.diff(seen), n))
        self.t_last[idx] = seen[-1]
        self.now = end
        self.steps += k
        if self.step_log is not None:
            self.step_log.extend([(n, n, 0, 0)] * k)
        u = self.pool.usage()
        if u > self.usage_max:
            self.usage_max = u
        if k == k_fin:
            return self._finish(np.flatnonzero(remaining == k), float(seen[-1]))
        return _EMPTY

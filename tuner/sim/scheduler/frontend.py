"""The API server beside each engine (:class:`FrontEnd`, mixed into
:class:`~tuner.sim.scheduler.engine_core.EngineCore`): when a request reaches the engine
and when a step's tokens reach users.

The API server beside each engine is one first-come-first-served queue
(:meth:`EngineCore.frontend_admit`): it takes in every request (``frontend_per_request_s``)
and streams every token the engine emits (``frontend_per_token_s``); the engine does not
wait for it, but a request reaches the engine only once the front end has worked through
what came before it, and a step's tokens reach users only after it. So under a backlog a
request waits twice: to get in, and for its first token. A step's tokens join the queue at
the step's end (:meth:`EngineCore.commit`), after any request taken in meanwhile.
"""
from __future__ import annotations

from collections import deque
from itertools import islice

import numpy as np


class FrontEnd:
    """The front end's first-come-first-served queue; a mixin of
    :class:`~tuner.sim.scheduler.engine_core.EngineCore`, whose state it reads and moves."""

    # -- the front end ----------------------------------------------------------------------
    # vLLM's API server is one process beside the engine (the engine does not wait for it):
    # it takes in each request (parse, validate, hand to the engine: ``frontend_per_request_s``)
    # and streams every token the engine emits (detokenise, frame, send:
    # ``frontend_per_token_s``), first come first served. A request it takes in while it is
    # still streaming earlier tokens waits behind them, and tokens emitted meanwhile wait
    # behind the request. Work is merged into ``fe_free`` in the order it came.
    def frontend_admit(self, t: float) -> float:
        """A request reaches the front end at ``t``: when the engine sees it (after the work
        queued before it and its own)."""
        if not self.fe_req:
            return t
        done, n, run = 0, self.R.shape[1], self._run
        if run is not None:
            start, k, _, _, cum, _ = run
            ends = start + cum[:k]
            done = int(np.searchsorted(ends, t, side="right"))
        # Requests come in time order, and each folds in every request queued before it: the
        # fold of the previous one goes on from where it stopped, the same sums in the same
        # order, while nothing was merged since (the same run, as far, the same fe_free).
        memo = self._fe_memo
        if (memo is not None and memo[0] is run and memo[1] == done and memo[2] == n
                and memo[3] == self.fe_free and t >= memo[4]):
            fe, queue = memo[5], deque(islice(self.fe_queue, memo[6], None))
        else:
            fe, queue = self.fe_free, deque(self.fe_queue)
            if done:
                fe = self._fifo_run(fe, ends[:done], n, queue)[1]
        fe = self._fifo_queue(fe, t, queue)
        folded = len(self.fe_queue) - len(queue)
        self.fe_queue.append((t, self.fe_req))
        # the request just queued joins the fold of the next one (after the run's steps
        # merged here, unless it came exactly at the last one's end: then start over)
        self._fe_memo = None if done and t <= ends[done - 1] else (run, done, n, self.fe_free, t, fe, folded)
        return max(fe, t) + self.fe_req

    @staticmethod
    def _fifo_queue(fe: float, until: float, queue: deque[tuple[float, float]]) -> float:
        """``fe`` after the queued requests that came by ``until`` (taken off ``queue``)."""
        while queue and queue[0][0] <= until:
            t, w = queue.popleft()
            fe = max(fe, t) + w
        return fe

    def _fifo_run(self, fe: float, ends: np.ndarray, n: int,
                  queue: deque[tuple[float, float]]) -> tuple[np.ndarray, float]:
        """Delivery times of consecutive steps of ``n`` tokens each ending at ``ends`` from
        front-end state ``fe``, the queued requests that came meanwhile merged in order
        (taken off ``queue``), and the state after: D_i = max(D_{i-1}, e_i) + c, in closed
        form D_i = (i+1)c + max(D_-1, max_{j<=i}(e_j - jc)) between two requests."""
        c = n * self.fe_cost
        if not queue or queue[0][0] > ends[-1]:      # nobody came in meanwhile: one closed form
            k = np.arange(len(ends), dtype=np.float64)
            out = (k + 1) * c + np.maximum(fe, np.maximum.accumulate(ends - k * c))
            return out, float(out[-1])
        out = np.empty(len(ends))
        i = 0
        while i < len(ends):
            j = len(ends)
            if queue and queue[0][0] <= ends[-1]:
                j = int(np.searchsorted(ends, queue[0][0], side="right"))
            if j > i:
                seg = ends[i:j]
                k = np.arange(len(seg), dtype=np.float64)
                out[i:j] = (k + 1) * c + np.maximum(fe, np.maximum.accumulate(seg - k * c))
                fe = float(out[j - 1])
                i = j
            if i < len(ends):
                t, w = queue.popleft()
                fe = max(fe, t) + w
        return out, fe

    def _deliver(self, end: float, tokens: int) -> float:
        """When the front end has handed over the ``tokens`` a step ending at ``end`` emitted
        (at once without front-end costs)."""
        if not self.fe_cost and not self.fe_req:
            return end
        self._fe_memo = None
        if self.fe_queue:
            self.fe_free = self._fifo_queue(self.fe_free, end, self.fe_queue)
        self.fe_free = max(self.fe_free, end) + tokens * self.fe_cost
        return self.fe_free

    def _deliver_run(self, ends: np.ndarray, n: int) -> np.ndarray:
        """:meth:`_deliver` for consecutive steps of ``n`` tokens each ending at ``ends``."""
        if not self.fe_cost and not self.fe_req:
            return ends
        self._fe_memo = None
        out, self.fe_free = self._fifo_run(self.fe_free, ends, n, self.fe_queue)
        return out

"""The API server beside each engine (:class:`FrontEnd`, owned by
:class:`~tuner.sim.scheduler.engine_core.EngineCore`): when a request reaches the engine
and when a step's tokens reach users.

The API server beside each engine is one first-come-first-served queue
(:meth:`FrontEnd.admit`): it takes in every request (``frontend_per_request_s``)
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
    """The front end's first-come-first-served queue.

    vLLM's API server is one process beside the engine (the engine does not wait for it):
    it takes in each request (parse, validate, hand to the engine: ``per_request_s``)
    and streams every token the engine emits (detokenise, frame, send: ``per_token_s``),
    first come first served. A request it takes in while it is still streaming earlier
    tokens waits behind them, and tokens emitted meanwhile wait behind the request. Work is
    merged into :attr:`free` in the order it came."""

    def __init__(self, per_token_s: float = 0.0, per_request_s: float = 0.0) -> None:
        self.per_token_s = per_token_s
        self.per_request_s = per_request_s
        self.free = 0.0                 # when the front end has done all the work merged so far
        self.queue: deque[tuple[float, float]] = deque()   # requests it took in, not yet merged
        self._memo: tuple | None = None  # where the last request's fold of the queue stopped

    @property
    def costs_time(self) -> bool:
        """The front end takes time for requests or tokens (else everything passes at once)."""
        return bool(self.per_token_s or self.per_request_s)

    def admit(self, t: float, run: tuple | None, n_running: int) -> float:
        """A request reaches the front end at ``t`` while the engine runs ``n_running``
        requests and has decode ``run`` pending (or None): when the engine sees it (after
        the work queued before it and its own)."""
        if not self.per_request_s:
            return t
        done = 0
        if run is not None:
            start, k, _, _, cum, _ = run
            ends = start + cum[:k]
            done = int(np.searchsorted(ends, t, side="right"))
        # Requests come in time order, and each folds in every request queued before it: the
        # fold of the previous one goes on from where it stopped, the same sums in the same
        # order, while nothing was merged since (the same run, as far, the same free).
        memo = self._memo
        if (memo is not None and memo[0] is run and memo[1] == done and memo[2] == n_running
                and memo[3] == self.free and t >= memo[4]):
            fe, queue = memo[5], deque(islice(self.queue, memo[6], None))
        else:
            fe, queue = self.free, deque(self.queue)
            if done:
                fe = self._fifo_run(fe, ends[:done], n_running, queue)[1]
        fe = _fifo_queue(fe, t, queue)
        folded = len(self.queue) - len(queue)
        self.queue.append((t, self.per_request_s))
        # the request just queued joins the fold of the next one (after the run's steps
        # merged here, unless it came exactly at the last one's end: then start over)
        self._memo = None if done and t <= ends[done - 1] else (run, done, n_running, self.free, t, fe, folded)
        return max(fe, t) + self.per_request_s

    def _fifo_run(self, fe: float, ends: np.ndarray, n: int,
                  queue: deque[tuple[float, float]]) -> tuple[np.ndarray, float]:
        """Delivery times of consecutive steps of ``n`` tokens each ending at ``ends`` from
        front-end state ``fe``, the queued requests that came meanwhile merged in order
        (taken off ``queue``), and the state after: D_i = max(D_{i-1}, e_i) + c, in closed
        form D_i = (i+1)c + max(D_-1, max_{j<=i}(e_j - jc)) between two requests."""
        c = n * self.per_token_s
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

    def deliver(self, end: float, tokens: int) -> float:
        """When the front end has handed over the ``tokens`` a step ending at ``end`` emitted
        (at once without front-end costs)."""
        if not self.costs_time:
            return end
        self._memo = None
        if self.queue:
            self.free = _fifo_queue(self.free, end, self.queue)
        self.free = max(self.free, end) + tokens * self.per_token_s
        return self.free

    def deliver_run(self, ends: np.ndarray, n: int) -> np.ndarray:
        """:meth:`deliver` for consecutive steps of ``n`` tokens each ending at ``ends``."""
        if not self.costs_time:
            return ends
        self._memo = None
        out, self.free = self._fifo_run(self.free, ends, n, self.queue)
        return out


def _fifo_queue(fe: float, until: float, queue: deque[tuple[float, float]]) -> float:
    """``fe`` after the queued requests that came by ``until`` (taken off ``queue``)."""
    while queue and queue[0][0] <= until:
        t, w = queue.popleft()
        fe = max(fe, t) + w
    return fe

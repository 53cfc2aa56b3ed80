"""The scheduler of one engine (:class:`Scheduler`, owned by
:class:`~tuner.sim.scheduler.engine_core.EngineCore`): the KV block pool, the WAITING queue
and the running batch, and the policy of a step over them: the running loop, preemption,
FCFS admission and retiring finished requests.

The running batch is one integer matrix (:attr:`Scheduler.batch`), a column per running
request in order, its rows named by :data:`REQ`, :data:`COMPUTED`, :data:`TOKENS`,
:data:`SHARED`, :data:`PRIVATE` and :data:`UNPUBLISHED`: a step costs a few dozen vector
operations however many requests run.

The policy follows ``vllm/v1/core/sched/scheduler.py::schedule`` (vLLM 0.33.0's
scheduler, read from its wheel):

* RUNNING requests first, in order; each asks ``num_tokens - num_computed_tokens`` tokens
  (1 for a decode, the rest of the prompt for a prefill) and gets at most what is left of
  the step's token budget (``max_num_batched_tokens``): decodes and chunked prefills share it;
  the loop stops when the budget is spent.
* when a running request needs a block and none is free, the LAST running request is
  preempted (recompute: its blocks are freed, ``num_computed_tokens`` = 0, it goes to the
  front of WAITING); if it is the request itself, it stops there.
* WAITING requests are admitted FCFS, only in a step without preemption, while fewer than
  ``max_num_seqs`` run and budget is left, and only when the whole prompt fits in the free
  blocks (``scheduler_reserve_full_isl``); the first that does not fit blocks the queue.
* prefix caching (``kvcache.BlockPool``): a hit is a chain of whole cached units, capped at
  ``num_tokens - 1`` tokens; a request's shared units are cached once its prefill ends.

Known simplifications (each small next to step-time error): hits count whole cache units
(``block_tokens / block_size`` blocks, 32 by default), so a partly evicted unit does not hit
at all; a prompt's shared units are cached when its
prefill ends, not chunk by chunk; priority scheduling, partial-prefill limits
(``max_num_partial_prefills``), the free-block watermark and speculative decoding are not modelled.

``--long-prefill-token-threshold`` (:func:`prefill_chunk`): a request that asks for more tokens
in one step than a positive threshold gets the threshold, running or newly admitted, before the
budget is applied (``if 0 < long_prefill_token_threshold < num_new_tokens``).
"""
from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from tuner.sim.kvcache import BlockPool
from tuner.sim.scheduler.requests import RequestTable
from tuner.sim.scheduler.steps import _EMPTY, _I

if TYPE_CHECKING:
    from tuner.serving.config import ServeConfig

#: rows of the running batch: the request's number, its computed tokens, the tokens it has
#: (prompt + output so far), the blocks it holds in shared (cached) units and its private
#: blocks, and whether its prompt's shared units wait to be cached when its prefill ends
REQ, COMPUTED, TOKENS, SHARED, PRIVATE, UNPUBLISHED = range(6)


def prefill_chunk(tokens, threshold: int):
    """The tokens a request may compute in one step under vLLM's ``long_prefill_token_threshold``
    (``v1/core/sched/scheduler.py``: ``if 0 < threshold < num_new_tokens: num_new_tokens =
    threshold``, for RUNNING and WAITING requests alike, before the step's budget): the smaller of
    ``tokens`` (an int or an array) and a positive ``threshold``; 0 (vLLM's default) caps nothing."""
    return np.minimum(tokens, threshold) if threshold > 0 else tokens


class Scheduler:
    """One engine's KV pool, WAITING queue and running batch, and vLLM's policy over them
    (after ``vllm/v1/core/sched/scheduler.py``: :meth:`schedule` a step,
    :meth:`update_from_output` once it ran)."""

    def __init__(self, config: ServeConfig, num_gpu_blocks: int, requests: RequestTable) -> None:
        self.bs = int(config.block_size)
        self.budget = int(config.max_num_batched_tokens)
        self.chunk_cap = int(config.long_prefill_token_threshold or 0)  # --long-prefill-token-threshold (0: none)
        # --enable-chunked-prefill; unset: vLLM's default (on); off: a prompt is prefilled in one step, or waits
        self.chunked = config.enable_chunked_prefill is not False
        self.max_seqs = int(config.max_num_seqs)
        self.caching = bool(config.enable_prefix_caching)
        self.pool = BlockPool(num_gpu_blocks, config.enable_prefix_caching)
        self.requests = requests
        self.batch = np.zeros((6, 0), dtype=_I)                    # the running batch (rows above)
        self.waiting: deque[int] = deque()
        self.refs: dict[int, list[tuple[object, int]]] = {}        # units j references now
        self.pending: dict[int, list[tuple[object, int]]] = {}     # units to cache after prefill
        self.own_start: dict[int, int] = {}                        # preempted j -> first own block
        self.rejected: list[int] = []                              # never fit in the KV pool
        self._blocked: tuple[int, int, int] | None = None   # (head, free, pool version) that did not fit
        self.pool_version = 0
        self.num_preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens_total = 0

    @property
    def num_running(self) -> int:
        return self.batch.shape[1]

    def blocks_in_use(self) -> int:
        """Blocks referenced by running requests (shared units counted once)."""
        return int(self.batch[PRIVATE].sum()) + self.pool.shared_referenced

    # -- block bookkeeping ---------------------------------------------------------------
    def free_running(self, col: int, keep_own: bool) -> None:
        """Release the blocks of running column ``col`` (preemption keeps its own unit cached)."""
        batch = self.batch
        j = int(batch[REQ, col])
        computed = int(batch[COMPUTED, col])
        shared = int(batch[SHARED, col])
        private = int(batch[PRIVATE, col])
        own = 0
        own_key = None
        if keep_own and self.caching:
            own = min(max(0, computed // self.bs - shared), private)
            own_key = ("own", j)
            self.own_start[j] = shared
        self.pool.release(self.refs.pop(j, ()), own_key, own, private - own)
        self.pending.pop(j, None)
        self.pool_version += 1

    def remove(self, j: int) -> None:
        """Drop request ``j`` wherever it is (WAITING, or running: its blocks are freed)."""
        if j in self.waiting:
            self.waiting.remove(j)
            return
        cols = np.flatnonzero(self.batch[REQ] == j)
        if len(cols):
            col = int(cols[0])
            self.free_running(col, keep_own=False)
            self.batch = np.delete(self.batch, col, axis=1)

    def fits(self, j: int) -> tuple[bool, object, int]:
        """Whether WAITING request ``j`` may be admitted now (whole prompt in free blocks)."""
        reqs = self.requests
        ntok = int(reqs.prompt[j] + reqs.out[j])
        own_start = self.own_start.get(j, -1)
        if not self.caching or (own_start < 0 and j not in reqs.hashes):
            return -(-ntok // self.bs) <= self.pool.free, None, ntok
        own_key = ("own", j) if own_start >= 0 else None
        plan = self.pool.lookup(reqs.units_of(j), own_key, own_start, (ntok - 1) // self.bs)
        need = max(0, -(-ntok // self.bs) - plan.cached_blocks) + plan.touched_free
        return need <= self.pool.free, plan, ntok

    def admission_blocked(self, n_running: int) -> bool:
        """Nobody can be admitted now (no room in the batch or budget, or the head does not fit)."""
        if not self.waiting or n_running >= self.max_seqs or self.budget - n_running <= 0:
            return True
        head = self.waiting[0]
        b = self._blocked
        if b is not None and b[0] == head and b[2] == self.pool_version and self.pool.free <= b[1]:
            return True
        ok = self.fits(head)[0]
        if not ok:
            self._blocked = (head, self.pool.free, self.pool_version)
        return not ok

    def finish(self, cols: np.ndarray, t: float) -> np.ndarray:
        """Retire finished running columns: their blocks go back uncached (private content
        of a finished request can never hit again), shared units lose a reference."""
        if len(cols) == 0:
            return _EMPTY
        batch = self.batch
        reqs = batch[REQ, cols]
        self.requests.t_done[reqs] = t
        self.pool.release_plain(int(batch[PRIVATE, cols].sum()))
        if self.refs:
            for j in reqs.tolist():
                units = self.refs.pop(j, None)
                if units:
                    self.pool.release(units, None, 0, 0)
                self.pending.pop(j, None)
        self.pool_version += 1
        keep = np.ones(batch.shape[1], dtype=bool)
        keep[cols] = False
        self.batch = batch.compress(keep, axis=1)
        return reqs

    # -- one step ------------------------------------------------------------------------
    def schedule(self, start: float) -> tuple[np.ndarray, int, int, int]:
        """The step starting at ``start``: RUNNING requests first (their blocks allocated,
        the last preempted while they do not fit), then WAITING ones FCFS in a step without
        preemption. Returns the tokens scheduled per column of the batch (which now holds the
        admitted requests too), their sum, and how many requests were preempted and admitted."""
        preempted = 0
        if self.batch.shape[1]:
            scheduled, total, preempted = self._schedule_running()
        else:
            scheduled, total = _EMPTY, 0
        admitted = 0
        if not preempted and self.waiting:
            new_cols = self._admit(self.budget - total, start)
            admitted = len(new_cols)
            if new_cols:
                cols = np.array(new_cols, dtype=_I).T
                self.batch = np.concatenate([self.batch, cols[:6]], axis=1)
                scheduled = np.concatenate([scheduled, cols[6]])
                total += int(cols[6].sum())
                self.pool_version += 1
        return scheduled, total, preempted, admitted

    def _schedule_running(self) -> tuple[np.ndarray, int, int]:
        """Tokens for each running request within the step's budget, and their blocks;
        returns the tokens per column, their sum and how many requests were preempted."""
        batch = self.batch
        computed = batch[COMPUTED]
        need = prefill_chunk(batch[TOKENS] - computed, self.chunk_cap)
        total = int(need.sum())
        if total <= self.budget:
            scheduled = need
        else:
            cs = np.cumsum(need)
            scheduled = np.minimum(need, np.maximum(self.budget - (cs - need), 0))
            total = int(scheduled.sum())
        new_blocks = np.maximum(-(-(computed + scheduled) // self.bs) - batch[SHARED] - batch[PRIVATE], 0)
        wanted = int(new_blocks.sum())
        if wanted <= self.pool.free:
            self.pool.allocate(wanted)
            batch[PRIVATE] += new_blocks
            return scheduled, total, 0
        scheduled, preempted = self._schedule_running_with_preemption(scheduled, new_blocks)
        self.num_preemptions += preempted
        self.pool_version += 1
        return scheduled, int(scheduled.sum()), preempted

    def _schedule_running_with_preemption(self, scheduled: np.ndarray,
                                          new_blocks: np.ndarray) -> tuple[np.ndarray, int]:
        """vLLM's running loop when blocks run out: requests take their blocks in order;
        when one does not fit, the LAST running request is preempted (repeatedly) until it
        does, or until it is itself the one preempted. The runs between preemptions are
        allocated with one cumulative sum each."""
        batch = self.batch
        pool = self.pool
        n = batch.shape[1]
        preempted = 0
        i = 0
        while i < n:
            cum = np.cumsum(new_blocks[i:n])
            fit = int(np.searchsorted(cum, pool.free, side="right"))
            if fit:
                pool.allocate(int(cum[fit - 1]))
                batch[PRIVATE, i: i + fit] += new_blocks[i: i + fit]
                i += fit
            if i >= n:
                break
            need_i = int(new_blocks[i])
            while need_i > pool.free:
                last = n - 1
                self.free_running(last, keep_own=True)
                self.waiting.appendleft(int(batch[REQ, last]))
                n -= 1
                preempted += 1
                if last == i:
                    break
            if i >= n:
                break
            pool.allocate(need_i)
            batch[PRIVATE, i] += need_i
            i += 1
        self.batch = batch[:, :n]
        return scheduled[:n], preempted

    def _admit(self, left: int, start: float) -> list[tuple[int, ...]]:
        """Admit WAITING requests FCFS while they fit; returns their new columns (the batch's
        rows, then the tokens scheduled)."""
        bs = self.bs
        pool = self.pool
        reqs = self.requests
        new_cols: list[tuple[int, ...]] = []
        n_run = self.batch.shape[1]
        waiting = self.waiting
        prompt, out = reqs.prompt, reqs.out
        simple = not self.caching
        free = pool.free        # blocks not yet handed out by this loop
        owed = 0                # blocks taken by simple admissions, allocated in one go
        while waiting and n_run < self.max_seqs and left > 0:
            j = waiting[0]
            if simple or (j not in reqs.hashes and j not in self.own_start):
                ntok = int(prompt[j] + out[j])
                if -(-ntok // bs) > free or not self.chunked and prefill_chunk(ntok, self.chunk_cap) > left:
                    break
                waiting.popleft()
                chunk = int(prefill_chunk(min(ntok, left), self.chunk_cap))
                new_blocks = -(-chunk // bs)
                free -= new_blocks
                owed += new_blocks
                hit = 0
                new_cols.append((j, 0, ntok, 0, new_blocks, 0, chunk))
            else:
                if owed:
                    pool.allocate(owed)
                    owed = 0
                col = self._admit_cached(j, left)
                if col is None:
                    break
                new_cols.append(col)
                hit, ntok, chunk = col[1], col[2], col[6]
                free = pool.free
            if math.isnan(reqs.t_sched[j]):
                reqs.t_sched[j] = start
                reqs.cached[j] = hit
                self.prompt_tokens_total += int(prompt[j])
            self.prefix_queries += ntok
            self.prefix_hits += hit
            left -= chunk
            n_run += 1
        if owed:
            pool.allocate(owed)
        return new_cols

    def _admit_cached(self, j: int, left: int) -> tuple[int, ...] | None:
        """Admit the head ``j`` with its prefix-cache hit (and, preempted, its own unit), or
        None when it does not fit; returns its new column."""
        pool = self.pool
        ok, plan, ntok = self.fits(j)
        if not ok or not self.chunked and prefill_chunk(ntok - plan.hit_blocks * self.bs, self.chunk_cap) > left:
            return None
        self.waiting.popleft()
        own_start = self.own_start.pop(j, -1)
        own_key = ("own", j) if own_start >= 0 else None
        pool.acquire(plan, own_key)
        if own_key is not None and not plan.own_blocks:
            pool.forget(own_key)
        hit = plan.hit_blocks * self.bs
        chunk = int(prefill_chunk(min(ntok - hit, left), self.chunk_cap))
        new_blocks = max(0, -(-(hit + chunk) // self.bs) - plan.cached_blocks)
        pool.allocate(new_blocks)
        if plan.units:
            self.refs[j] = list(plan.units)
        pend = self.requests.units_of(j)[len(plan.units):]
        if pend:
            self.pending[j] = pend
        return (j, hit, ntok, plan.shared_blocks, plan.own_blocks + new_blocks, 1 if pend else 0, chunk)

    def reject_head(self, t: float) -> int:
        """The head of WAITING can never fit (prompt larger than the whole KV pool): vLLM
        would hang; the simulator fails the request instead. Returns its number."""
        j = self.waiting.popleft()
        self.requests.t_done[j] = t
        self.rejected.append(j)
        return j

    def update_from_output(self, new_computed: np.ndarray, end: float) -> tuple[np.ndarray, np.ndarray]:
        """The step ending at ``end`` computed the batch up to ``new_computed``: a request
        whose tokens are all computed emits one; returns the requests that emitted and
        those that finished (retired)."""
        batch = self.batch
        batch[COMPUTED] = new_computed
        cols = np.flatnonzero(new_computed == batch[TOKENS])   # all its tokens computed: it emits one
        if not len(cols):
            return _EMPTY, _EMPTY
        reqs = self.requests
        emitted = batch[REQ, cols]
        reqs.out[emitted] += 1
        batch[TOKENS, cols] += 1
        if self.pending:
            self._publish(cols[batch[UNPUBLISHED, cols] > 0])
        done = reqs.out[emitted] >= reqs.max_out[emitted]
        finished = self.finish(cols[done], end) if done.any() else _EMPTY
        return emitted, finished

    def _publish(self, cols: np.ndarray) -> None:
        """Cache the shared units of the prompts of ``cols``, whose prefill just ended."""
        batch = self.batch
        for col in cols.tolist():
            j = int(batch[REQ, col])
            units = self.pending.pop(j)
            _, moved, dup = self.pool.publish(units)
            self.refs.setdefault(j, []).extend(units)
            batch[SHARED, col] += moved + dup
            batch[PRIVATE, col] -= moved + dup
            batch[UNPUBLISHED, col] = 0
        if len(cols):
            self.pool_version += 1

    def decode(self, steps: int) -> np.ndarray:
        """Apply ``steps`` decode steps to the whole batch at once (their blocks allocated);
        returns the requests of the batch."""
        batch = self.batch
        computed = batch[COMPUTED]
        new_blocks = np.maximum(-(-(computed + steps) // self.bs) - batch[SHARED] - batch[PRIVATE], 0)
        self.pool.allocate(int(new_blocks.sum()))
        batch[PRIVATE] += new_blocks
        batch[COMPUTED] += steps
        batch[TOKENS] += steps
        reqs = batch[REQ]
        self.requests.out[reqs] += steps
        return reqs

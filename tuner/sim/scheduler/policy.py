"""The scheduling policy of one engine step (:class:`SchedulePolicy`, mixed into
:class:`~tuner.sim.scheduler.engine_core.EngineCore`): the running loop, preemption,
FCFS admission and retiring finished requests.

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

import numpy as np

from tuner.sim.scheduler.steps import _EMPTY, _I, Advance


def prefill_chunk(tokens, threshold: int):
    """The tokens a request may compute in one step under vLLM's ``long_prefill_token_threshold``
    (``v1/core/sched/scheduler.py``: ``if 0 < threshold < num_new_tokens: num_new_tokens =
    threshold``, for RUNNING and WAITING requests alike, before the step's budget): the smaller of
    ``tokens`` (an int or an array) and a positive ``threshold``; 0 (vLLM's default) caps nothing."""
    return np.minimum(tokens, threshold) if threshold > 0 else tokens


class SchedulePolicy:
    """One engine step as vLLM's scheduler takes it; a mixin of
    :class:`~tuner.sim.scheduler.engine_core.EngineCore`, whose state it reads and moves."""

    def _finish(self, cols: np.ndarray, t: float) -> np.ndarray:
        """Retire finished running columns: their blocks go back uncached (private content
        of a finished request can never hit again), shared units lose a reference."""
        if len(cols) == 0:
            return _EMPTY
        R = self.R
        js = R[self.IDX, cols]
        self.t_done[js] = t
        self.pool.release_plain(int(R[self.P, cols].sum()))
        if self.refs:
            for j in js.tolist():
                units = self.refs.pop(j, None)
                if units:
                    self.pool.release(units, None, 0, 0)
                self.pending.pop(j, None)
        self._pool_version += 1
        keep = np.ones(R.shape[1], dtype=bool)
        keep[cols] = False
        self.R = R.compress(keep, axis=1)
        return js

    def _schedule_running_with_preemption(self, sched: np.ndarray, newb: np.ndarray) -> tuple[np.ndarray, int]:
        """vLLM's running loop when blocks run out: requests take their blocks in order;
        when one does not fit, the LAST running request is preempted (repeatedly) until it
        does, or until it is itself the one preempted. The runs between preemptions are
        allocated with one cumulative sum each."""
        R = self.R
        P = self.P
        pool = self.pool
        n = R.shape[1]
        preempted = 0
        i = 0
        while i < n:
            cum = np.cumsum(newb[i:n])
            fit = int(np.searchsorted(cum, pool.free, side="right"))
            if fit:
                pool.allocate(int(cum[fit - 1]))
                R[P, i: i + fit] += newb[i: i + fit]
                i += fit
            if i >= n:
                break
            need_i = int(newb[i])
            while need_i > pool.free:
                last = n - 1
                self._free_running(last, keep_own=True)
                self.waiting.appendleft(int(R[self.IDX, last]))
                n -= 1
                preempted += 1
                if last == i:
                    break
            if i >= n:
                break
            pool.allocate(need_i)
            R[P, i] += need_i
            i += 1
        self.R = R[:, :n]
        return sched[:n], preempted

    def _admit(self, left: int, start: float) -> list[tuple[int, ...]]:
        """Admit WAITING requests FCFS while they fit; returns their new columns."""
        bs = self.bs
        pool = self.pool
        new_cols: list[tuple[int, ...]] = []
        n_run = self.R.shape[1]
        waiting = self.waiting
        prompt, out = self.prompt, self.out
        simple = not self.caching
        free = pool.free        # blocks not yet handed out by this loop
        owed = 0                # blocks taken by simple admissions, allocated in one go
        while waiting and n_run < self.max_seqs and left > 0:
            j = waiting[0]
            if simple or (j not in self._hash and j not in self.own_start):
                ntok = int(prompt[j] + out[j])
                if -(-ntok // bs) > free:
                    break
                waiting.popleft()
                s = int(prefill_chunk(min(ntok, left), self.chunk_cap))
                nb = -(-s // bs)
                free -= nb
                owed += nb
                hit = 0
                new_cols.append((j, 0, ntok, 0, nb, 0, s))
            else:
                if owed:
                    pool.allocate(owed)
                    owed = 0
                ok, plan, ntok = self._fits(j)
                if not ok:
                    break
                waiting.popleft()
                own_start = self.own_start.pop(j, -1)
                own_key = ("own", j) if own_start >= 0 else None
                pool.acquire(plan, own_key)
                if own_key is not None and not plan.own_blocks:
                    pool.forget(own_key)
                hit = plan.hit_blocks * bs
                s = int(prefill_chunk(min(ntok - hit, left), self.chunk_cap))
                nb = max(0, -(-(hit + s) // bs) - plan.cached_blocks)
                pool.allocate(nb)
                if plan.units:
                    self.refs[j] = list(plan.units)
                units = self._units_of(j)
                pend = units[len(plan.units):]
                if pend:
                    self.pending[j] = pend
                new_cols.append((j, hit, ntok, plan.shared_blocks, plan.own_blocks + nb,
                                 1 if pend else 0, s))
                free = pool.free
            if math.isnan(self.t_sched[j]):
                self.t_sched[j] = start
                self.cached[j] = hit
                self.prompt_tokens_total += int(prompt[j])
            self.prefix_queries += ntok
            self.prefix_hits += hit
            left -= s
            n_run += 1
        if owed:
            pool.allocate(owed)
        return new_cols

    def _step(self) -> Advance:
        bs = self.bs
        start = self.now
        R = self.R
        n = R.shape[1]
        preempted = 0
        if n:
            comp = R[self.COMP]
            need = prefill_chunk(R[self.NTOK] - comp, self.chunk_cap)
            total = int(need.sum())
            if total <= self.budget:
                sched = need
            else:
                cs = np.cumsum(need)
                sched = np.minimum(need, np.maximum(self.budget - (cs - need), 0))
                total = int(sched.sum())
            newb = np.maximum(-(-(comp + sched) // bs) - R[self.S] - R[self.P], 0)
            tot = int(newb.sum())
            if tot <= self.pool.free:
                self.pool.allocate(tot)
                R[self.P] += newb
            else:
                sched, preempted = self._schedule_running_with_preemption(sched, newb)
                total = int(sched.sum())
                self.num_preemptions += preempted
                self._pool_version += 1
                R = self.R
        else:
            sched = _EMPTY
            total = 0
        admitted = 0
        if not preempted and self.waiting:
            new_cols = self._admit(self.budget - total, start)
            admitted = len(new_cols)
            if new_cols:
                cols = np.array(new_cols, dtype=_I).T
                R = self.R = np.concatenate([R, cols[:6]], axis=1)
                sched = np.concatenate([sched, cols[6]])
                total += int(cols[6].sum())
                self._pool_version += 1
        T = total
        if T == 0:
            if not R.shape[1] and not preempted and self.waiting:
                # the head can never fit (prompt larger than the whole KV pool): vLLM would
                # hang; the simulator fails the request instead.
                j = self.waiting.popleft()
                self.t_done[j] = start
                self.rejected.append(j)
                return Advance(start, 0, np.array([j], dtype=_I), 0)
            # nothing ran (everything preempted this step); charge the fixed overhead
            self.now = start + self.timer.fixed
            self.steps += 1
            if self.step_log is not None:
                self.step_log.append((0, 0, preempted, 0))
            return Advance(self.now, 1, _EMPTY, preempted)
        comp = R[self.COMP]
        ntok = R[self.NTOK]
        n = R.shape[1]
        n_seqs = n if T >= n and sched.min() > 0 else int(np.count_nonzero(sched))
        decode_only = T == n_seqs and n_seqs == n and int((ntok - comp).max()) == 1
        new_comp = comp + sched
        ctx = float(new_comp[sched > 0].sum()) if n_seqs < n else float(new_comp.sum())
        attn = float((sched * (comp + new_comp + 1)).sum()) * 0.5
        dur = self.timer.step(T, n_seqs, decode_only, ctx, attn)
        end = start + dur
        self.now = end
        self.steps += 1
        if self.step_log is not None:
            self.step_log.append((T, n_seqs, preempted, admitted))
        R[self.COMP] = new_comp
        cols = np.flatnonzero(new_comp == ntok)   # a request emits a token when all its tokens are computed
        finished = _EMPTY
        if len(cols):
            js = R[self.IDX, cols]
            self.last_emitted = js
            self.out[js] += 1
            R[self.NTOK, cols] += 1
            self.generation_tokens += len(cols)
            if self.pending:
                # cache the shared units of prompts whose prefill just ended
                pub = cols[R[self.PUB, cols] > 0]
                for i in pub.tolist():
                    j = int(R[self.IDX, i])
                    units = self.pending.pop(j)
                    _, moved, dup = self.pool.publish(units)
                    self.refs.setdefault(j, []).extend(units)
                    R[self.S, i] += moved + dup
                    R[self.P, i] -= moved + dup
                    R[self.PUB, i] = 0
                if len(pub):
                    self._pool_version += 1
            done = self.out[js] >= self.max_out[js]
            if done.any():
                finished = self._finish(cols[done], end)
            self._emit = (end, js, finished)   # reach users at commit(): see _deliver
        u = self.pool.usage()
        if u > self.usage_max:
            self.usage_max = u
        return Advance(end, 1, finished, preempted)

"""One vLLM V1 engine (a replica) stepped in virtual time: scheduler, KV pool, step time.

The policy follows ``vllm/v1/core/sched/scheduler.py::schedule`` (see
``../shared/reference/vllm-facts.md`` section 2):

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

Per-request state of the running batch lives in numpy arrays, so a step costs a few dozen
vector operations however many requests run. When nothing can change for a while (all
running requests decode, none finishes, no block runs out, nobody can be admitted and no
outside event is due) :meth:`EngineCore.advance` jumps over ``k`` decode steps at once:
their durations come from :meth:`StepTimer.decode_run` and are identical to stepping.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tuner.sim.calibration import Calibration, load_calibration
from tuner.sim.kvcache import BlockPool
from tuner.sim.steptime import StepTimer

if TYPE_CHECKING:
    from tuner.sim.memory import MemoryPlan

_I = np.int64
_EMPTY = np.zeros(0, dtype=_I)


def shared_units(hash_ids: tuple[int, ...], block_tokens: int, prompt_tokens: int,
                 block_size: int) -> list[tuple[object, int]]:
    """Cache units of a prompt whose ``block_tokens``-token pieces are named by ``hash_ids``:
    the engine blocks (``block_size`` tokens, full, inside the named part of the prompt)
    whose last token lies in piece k form unit k, keyed by the chained hash of ids 0..k and
    its block count (vLLM: ``hash_block_tokens(parent_hash, tokens)``)."""
    units: list[tuple[object, int]] = []
    covered = min(len(hash_ids) * block_tokens, prompt_tokens)
    chain = 0
    prev_blocks = 0
    for k, hid in enumerate(hash_ids):
        if k * block_tokens >= covered:
            break
        chain = hash((chain, int(hid)))
        end_blocks = min((k + 1) * block_tokens, covered) // block_size
        n = end_blocks - prev_blocks
        prev_blocks = end_blocks
        if n > 0:
            units.append((("shared", chain, n), n))
    return units


@dataclass(slots=True)
class StepOutput:
    """What one call of :meth:`EngineCore.step` did."""

    duration_s: float
    new_tokens: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    num_preempted: int = 0


@dataclass(slots=True)
class Advance:
    """What one :meth:`EngineCore.advance` did: ``steps`` engine steps ending at ``end_s``."""

    end_s: float
    steps: int
    finished: np.ndarray          # request indices that completed (their last token at end_s)
    num_preempted: int = 0


class EngineCore:
    """One replica. Requests are numbered in order of :meth:`add_request`; times are the
    core's virtual clock (``now``, seconds), which the caller may move forward while idle."""

    def __init__(self, plan: MemoryPlan, profile: Calibration | None = None, *,
                 fast: bool = True, record_itl: bool = False) -> None:
        self.plan = plan
        self.calib = profile if profile is not None else load_calibration(plan.gpu)
        self.timer = StepTimer(plan, self.calib)
        self.bs = int(plan.block_size)
        self.budget = int(plan.max_num_batched_tokens)
        self.max_seqs = int(plan.max_num_seqs)
        self.max_model_len = int(plan.max_model_len)
        self.pool = BlockPool(plan.num_gpu_blocks, plan.enable_prefix_caching)
        self.caching = bool(plan.enable_prefix_caching)
        self.fast = fast
        self.record_itl = record_itl
        self.now = 0.0
        # per request (index j), grown on demand
        self._cap = 0
        self._n = 0
        self.ids: list[str] = []
        self._index: dict[str, int] = {}
        self.prompt = _EMPTY.copy()
        self.max_out = _EMPTY.copy()
        self.out = _EMPTY.copy()
        self.t_sched = np.zeros(0)      # first time scheduled (NaN until then)
        self.t_first = np.zeros(0)      # first token
        self.t_done = np.zeros(0)       # finished
        self.t_last = np.zeros(0)       # last token (for ITL)
        self.cached = _EMPTY.copy()     # prefix-hit tokens at first admission
        self.units: list[list[tuple[object, int]] | None] = []   # shared units per request
        self.refs: list[list[tuple[object, int]]] = []            # units it references now
        self.pending: list[list[tuple[object, int]]] = []         # units to cache after prefill
        self.own_start: list[int] = []
        self.aborted: set[int] = set()
        self.rejected: list[int] = []                  # never fit in the KV pool
        # running batch, in order (parallel arrays)
        self.r_idx = _EMPTY.copy()
        self.r_comp = _EMPTY.copy()
        self.r_ntok = _EMPTY.copy()
        self.r_S = _EMPTY.copy()        # blocks in referenced shared units
        self.r_p = _EMPTY.copy()        # private blocks
        self.r_pub = np.zeros(0, dtype=bool)
        self.waiting: deque[int] = deque()
        self._blocked: tuple[int, int, int] | None = None   # (head, free, pool version) that did not fit
        self._pool_version = 0
        # counters
        self.num_preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens_total = 0
        self.generation_tokens = 0
        self.steps = 0
        self.usage_max = 0.0
        self.itl_chunks: list[np.ndarray] = []
        self.step_log: list[tuple[int, int, int]] | None = None   # (tokens, seqs, preempted), tests

    # -- requests -------------------------------------------------------------------------
    def _grow(self) -> None:
        cap = max(16, 2 * self._cap)
        for name in ("prompt", "max_out", "out", "cached"):
            a = getattr(self, name)
            b = np.zeros(cap, dtype=_I)
            b[: len(a)] = a
            setattr(self, name, b)
        for name in ("t_sched", "t_first", "t_done", "t_last"):
            a = getattr(self, name)
            b = np.full(cap, np.nan)
            b[: len(a)] = a
            setattr(self, name, b)
        self._cap = cap

    def add_request(self, req_id: str, prompt_tokens: int, output_tokens: int,
                    hash_ids: tuple[int, ...] = (), block_tokens: int = 512) -> int:
        """Queue a request (WAITING). Output is clamped to ``max_model_len - prompt``, as
        vLLM clamps ``max_tokens``; the caller rejects prompts of ``max_model_len`` or more.
        Returns the request's index."""
        j = self._n
        if j >= self._cap:
            self._grow()
        self._n += 1
        self.ids.append(req_id)
        self._index[req_id] = j
        p = int(prompt_tokens)
        self.prompt[j] = p
        self.max_out[j] = max(1, min(int(output_tokens), self.max_model_len - p))
        units = (shared_units(tuple(hash_ids), block_tokens, p, self.bs)
                 if (self.caching and hash_ids) else None)
        self.units.append(units)
        self.refs.append([])
        self.pending.append([])
        self.own_start.append(-1)
        self.waiting.append(j)
        return j

    def abort(self, req_id: str) -> None:
        """Drop a request (client went away): its blocks are freed."""
        j = self._index.get(req_id)
        if j is None or j in self.aborted or not math.isnan(self.t_done[j]):
            return
        self.aborted.add(j)
        if j in self.waiting:
            self.waiting.remove(j)
            return
        pos = np.flatnonzero(self.r_idx == j)
        if len(pos):
            i = int(pos[0])
            self._free_running(i, keep_own=False)
            self._drop_rows(np.array([i]))

    def has_work(self) -> bool:
        return bool(len(self.r_idx) or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.r_idx)

    def stats(self) -> dict:
        return {
            "num_running": len(self.r_idx),
            "num_waiting": len(self.waiting),
            "kv_cache_usage": self.pool.usage(),
            "num_preemptions": self.num_preemptions,
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "prompt_tokens": self.prompt_tokens_total,
            "generation_tokens": self.generation_tokens,
        }

    def blocks_in_use(self) -> int:
        """Blocks referenced by running requests (shared units counted once)."""
        return int(self.r_p.sum()) + self.pool.shared_referenced

    # -- block bookkeeping ---------------------------------------------------------------
    def _free_running(self, i: int, keep_own: bool) -> None:
        """Release the blocks of running row ``i`` (preemption keeps its own unit cached)."""
        j = int(self.r_idx[i])
        comp = int(self.r_comp[i])
        S = int(self.r_S[i])
        p = int(self.r_p[i])
        own = 0
        own_key = None
        if keep_own and self.caching:
            own = min(max(0, comp // self.bs - S), p)
            own_key = ("own", j)
            self.own_start[j] = S
        self.pool.release(self.refs[j], own_key, own, p - own)
        self.refs[j] = []
        self.pending[j] = []
        self._pool_version += 1

    def _drop_rows(self, rows: np.ndarray) -> None:
        keep = np.ones(len(self.r_idx), dtype=bool)
        keep[rows] = False
        self.r_idx = self.r_idx[keep]
        self.r_comp = self.r_comp[keep]
        self.r_ntok = self.r_ntok[keep]
        self.r_S = self.r_S[keep]
        self.r_p = self.r_p[keep]
        self.r_pub = self.r_pub[keep]

    def _fits(self, j: int) -> tuple[bool, object, int]:
        """Whether WAITING request ``j`` may be admitted now (whole prompt in free blocks)."""
        ntok = int(self.prompt[j] + self.out[j])
        own_key = ("own", j) if self.own_start[j] >= 0 else None
        plan = self.pool.lookup(self.units[j] or [], own_key, self.own_start[j], (ntok - 1) // self.bs)
        need = -(-ntok // self.bs) - plan.hit_blocks + plan.touched_free
        return need <= self.pool.free, plan, ntok

    # -- stepping -------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """One engine step (never the multi-step fast path), for real-time drivers."""
        before = self.out[: self._n].copy()
        adv = self.advance(math.inf, allow_fast=False)
        gained = self.out[: self._n] - before
        new_tokens = {self.ids[j]: int(gained[j]) for j in np.flatnonzero(gained)}
        return StepOutput(
            duration_s=adv.end_s - self._last_start,
            new_tokens=new_tokens,
            finished=[self.ids[j] for j in adv.finished],
            num_preempted=adv.num_preempted,
        )

    def advance(self, horizon_s: float = math.inf, allow_fast: bool = True) -> Advance:
        """Run one step, or a run of decode-only steps that ends at the first step boundary
        at or after ``now + horizon_s`` (when the caller expects an outside event then).
        Advances ``now``; returns what finished at the new ``now``."""
        self._last_start = self.now
        if allow_fast and self.fast:
            adv = self._try_decode_run(horizon_s)
            if adv is not None:
                return adv
        return self._step()

    def _admission_blocked(self, n_running: int) -> bool:
        if not self.waiting or n_running >= self.max_seqs or self.budget - n_running <= 0:
            return True
        head = self.waiting[0]
        key = (head, self.pool.free, self._pool_version)
        if self._blocked is not None and self._blocked[0] == head and self._blocked[2] == self._pool_version \
                and self.pool.free <= self._blocked[1]:
            return True
        ok, _, _ = self._fits(head)
        if not ok:
            self._blocked = key
        return not ok

    def _try_decode_run(self, horizon_s: float) -> Advance | None:
        n = len(self.r_idx)
        if n == 0 or n > self.budget:
            return None
        comp, ntok = self.r_comp, self.r_ntok
        if not np.array_equal(ntok - comp, np.ones(n, dtype=_I)):
            return None
        if not self._admission_blocked(n):
            return None
        idx = self.r_idx
        remaining = self.max_out[idx] - self.out[idx]
        kmax = int(remaining.min())
        held = self.r_S + self.r_p
        bs = self.bs
        free = self.pool.free

        def need(k: int) -> np.ndarray:
            return np.maximum(-(-(comp + k) // bs) - held, 0)

        total = int(need(kmax).sum())
        if total > free:
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
            k = int(np.searchsorted(cum, horizon_s, side="left")) + 1
            k = min(k, kmax)
        newb = need(k)
        self.pool.allocate(int(newb.sum()))
        self.r_p = self.r_p + newb
        self.r_comp = comp + k
        self.r_ntok = ntok + k
        self.out[idx] += k
        self.generation_tokens += n * k
        start = self.now
        end = start + float(cum[k - 1])
        if self.record_itl:
            first_gap = start + durs[0] - self.t_last[idx]
            self.itl_chunks.append(first_gap)
            if k > 1:
                self.itl_chunks.append(np.repeat(durs[1:k], n))
        self.t_last[idx] = end
        self.now = end
        self.steps += k
        if self.step_log is not None:
            self.step_log.extend([(n, n, 0)] * k)
        u = self.pool.usage()
        if u > self.usage_max:
            self.usage_max = u
        if k == kmax and k == int(remaining.min()):
            fin_rows = np.flatnonzero(self.out[idx] >= self.max_out[idx])
            return Advance(end, k, self._finish(fin_rows, end))
        return Advance(end, k, _EMPTY)

    def _finish(self, rows: np.ndarray, t: float) -> np.ndarray:
        if len(rows) == 0:
            return _EMPTY
        js = self.r_idx[rows].copy()
        self.t_done[js] = t
        for i in rows:
            self._free_running(int(i), keep_own=False)
        self._drop_rows(rows)
        return js

    def _schedule_running_with_preemption(self, need: np.ndarray) -> tuple[np.ndarray, int]:
        """vLLM's running loop when blocks run out: preempt the last running request."""
        bs = self.bs
        budget = self.budget
        sched = np.zeros(len(self.r_idx), dtype=_I)
        preempted = 0
        i = 0
        n = len(self.r_idx)
        while i < n and budget > 0:
            s = int(min(need[i], budget))
            nb = max(0, -(-(int(self.r_comp[i]) + s) // bs) - int(self.r_S[i] + self.r_p[i]))
            scheduled = True
            while nb > self.pool.free:
                last = n - 1
                self._free_running(last, keep_own=True)
                j = int(self.r_idx[last])
                self.r_comp[last] = 0
                self.waiting.appendleft(j)
                self._drop_rows(np.array([last]))
                need = need[:last]
                sched = sched[:last]
                n -= 1
                preempted += 1
                if last == i:
                    scheduled = False
                    break
            if not scheduled:
                break
            self.pool.allocate(nb)
            self.r_p[i] += nb
            sched[i] = s
            budget -= s
            i += 1
        return sched, preempted

    def _step(self) -> Advance:
        bs = self.bs
        start = self.now
        n = len(self.r_idx)
        preempted = 0
        if n:
            need = self.r_ntok - self.r_comp
            cs = np.cumsum(need)
            sched = np.minimum(need, np.maximum(self.budget - (cs - need), 0))
            newb = np.maximum(-(-(self.r_comp + sched) // bs) - (self.r_S + self.r_p), 0)
            tot = int(newb.sum())
            if tot <= self.pool.free:
                self.pool.allocate(tot)
                self.r_p = self.r_p + newb
            else:
                sched, preempted = self._schedule_running_with_preemption(need)
                self.num_preemptions += preempted
                self._pool_version += 1
        else:
            sched = _EMPTY
        left = self.budget - int(sched.sum())
        # admission
        if not preempted and self.waiting:
            new_rows = []
            n_run = len(self.r_idx)
            while self.waiting and n_run < self.max_seqs and left > 0:
                j = self.waiting[0]
                ok, plan, ntok = self._fits(j)
                if not ok:
                    break
                self.waiting.popleft()
                own_key = ("own", j) if self.own_start[j] >= 0 else None
                self.pool.acquire(plan, own_key)
                if own_key is not None and not plan.own_blocks:
                    self.pool.forget(own_key)
                self.own_start[j] = -1
                hit = plan.hit_blocks * bs
                s = min(ntok - hit, left)
                nb = -(-(hit + s) // bs) - plan.hit_blocks
                self.pool.allocate(nb)
                self.refs[j] = list(plan.units)
                units = self.units[j]
                self.pending[j] = units[len(plan.units):] if units else []
                first = math.isnan(self.t_sched[j])
                if first:
                    self.t_sched[j] = start
                    self.cached[j] = hit
                    self.prompt_tokens_total += int(self.prompt[j])
                self.prefix_queries += ntok
                self.prefix_hits += hit
                new_rows.append((j, hit, ntok, plan.shared_blocks, plan.own_blocks + nb,
                                 bool(self.pending[j]), s))
                left -= s
                n_run += 1
            if new_rows:
                cols = list(zip(*new_rows))
                self.r_idx = np.concatenate([self.r_idx, np.array(cols[0], dtype=_I)])
                self.r_comp = np.concatenate([self.r_comp, np.array(cols[1], dtype=_I)])
                self.r_ntok = np.concatenate([self.r_ntok, np.array(cols[2], dtype=_I)])
                self.r_S = np.concatenate([self.r_S, np.array(cols[3], dtype=_I)])
                self.r_p = np.concatenate([self.r_p, np.array(cols[4], dtype=_I)])
                self.r_pub = np.concatenate([self.r_pub, np.array(cols[5], dtype=bool)])
                sched = np.concatenate([sched, np.array(cols[6], dtype=_I)])
                self._pool_version += 1
        T = int(sched.sum())
        if T == 0:
            if not len(self.r_idx) and not preempted and self.waiting:
                # the head can never fit (prompt larger than the whole KV pool): vLLM would
                # hang; the simulator fails the request instead.
                j = self.waiting.popleft()
                self.t_done[j] = start
                self.rejected.append(j)
                return Advance(start, 0, np.array([j], dtype=_I), 0)
            # nothing ran (everything preempted this step); charge the fixed overhead
            dur = self.timer.fixed
            self.now = start + dur
            self.steps += 1
            if self.step_log is not None:
                self.step_log.append((0, 0, preempted))
            return Advance(self.now, 1, _EMPTY, preempted)
        active = sched > 0
        comp = self.r_comp
        n_seqs = int(active.sum())
        decode_only = T == n_seqs and bool((self.r_ntok[active] - comp[active] == 1).all())
        ctx = float((comp + sched)[active].sum())
        attn = float((sched * (comp + (sched + 1) / 2.0)).sum())
        dur = self.timer.step(T, n_seqs, decode_only, ctx, attn)
        end = start + dur
        self.now = end
        self.steps += 1
        if self.step_log is not None:
            self.step_log.append((T, n_seqs, preempted))
        self.r_comp = comp + sched
        emitted = active & (self.r_comp == self.r_ntok)
        rows = np.flatnonzero(emitted)
        finished = _EMPTY
        if len(rows):
            js = self.r_idx[rows]
            self.out[js] += 1
            self.r_ntok[rows] += 1
            self.generation_tokens += len(rows)
            first = np.isnan(self.t_first[js])
            if first.any():
                self.t_first[js[first]] = end
            if self.record_itl:
                gaps = end - self.t_last[js]
                self.itl_chunks.append(gaps[~np.isnan(gaps)])
            self.t_last[js] = end
            # cache the shared units of prompts whose prefill just ended
            pub = rows[self.r_pub[rows]]
            for i in pub:
                j = int(self.r_idx[i])
                units = self.pending[j]
                _, moved, dup = self.pool.publish(units)
                self.refs[j].extend(units)
                self.pending[j] = []
                self.r_S[i] += moved + dup
                self.r_p[i] -= moved + dup
                self.r_pub[i] = False
            if len(pub):
                self._pool_version += 1
            fin = rows[self.out[js] >= self.max_out[js]]
            if len(fin):
                finished = self._finish(fin, end)
        u = self.pool.usage()
        if u > self.usage_max:
            self.usage_max = u
        return Advance(end, 1, finished, preempted)

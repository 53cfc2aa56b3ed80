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

Known simplifications (each small next to step-time error): hits count whole cache units
(``block_tokens / block_size`` blocks, 32 by default), so a partly evicted unit does not hit
at all; a prompt's shared units are cached when its
prefill ends, not chunk by chunk; ``long_prefill_token_threshold``, priority scheduling,
the free-block watermark and speculative decoding are not modelled.

The API server beside each engine is one first-come-first-served queue
(:meth:`EngineCore.frontend_admit`): it takes in every request (``frontend_per_request_s``)
and streams every token the engine emits (``frontend_per_token_s``); the engine does not
wait for it, but a request reaches the engine only once the front end has worked through
what came before it, and a step's tokens reach users only after it. So under a backlog a
request waits twice: to get in, and for its first token. A step's tokens join the queue at
the step's end (:meth:`EngineCore.commit`), after any request taken in meanwhile.

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
    deferred: bool = False        # a planned decode run: finished comes from commit_run()


class EngineCore:
    """One replica. Requests are numbered in order of :meth:`add_request` (or :meth:`load`);
    times are the core's virtual clock (``now``, seconds), which the caller may move
    forward while the core is idle."""

    # rows of the running-batch matrix ``R`` (one column per running request, in order)
    IDX, COMP, NTOK, S, P, PUB = range(6)

    def __init__(self, plan: MemoryPlan, profile: Calibration | None = None, *,
                 fast: bool = True, record_itl: bool = False) -> None:
        self.plan = plan
        self.calib = profile if profile is not None else load_calibration(plan.gpu, vllm_version=plan.vllm_version)
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
        self.fe_cost = float(getattr(self.calib, "frontend_per_token_s", 0.0))
        self.fe_req = float(getattr(self.calib, "frontend_per_request_s", 0.0))
        self.fe_free = 0.0              # when the front end has done all the work merged so far
        self.fe_queue: deque[tuple[float, float]] = deque()   # requests it took in, not yet merged
        self._emit: tuple | None = None  # a deferred step's tokens, delivered by commit()
        self._last_start = 0.0
        self.last_emitted = _EMPTY      # requests that got a token in the last single step
        self._run: tuple | None = None  # planned decode run (start, k, k_fin, durs, cum, remaining)
        # per request (index j)
        self._cap = 0
        self._n = 0
        self.ids: list[str] = []
        self._index: dict[str, int] = {}
        self.prompt = _EMPTY.copy()
        self.max_out = _EMPTY.copy()
        self.out = _EMPTY.copy()
        self.cached = _EMPTY.copy()     # prefix-hit tokens at first admission
        self.t_sched = np.zeros(0)      # first time scheduled (NaN until then)
        self.t_first = np.zeros(0)      # first token
        self.t_done = np.zeros(0)       # finished
        self.t_last = np.zeros(0)       # last token (for ITL)
        self._hash: dict[int, tuple[tuple[int, ...], int]] = {}    # j -> (hash_ids, block_tokens)
        self._units: dict[int, list[tuple[object, int]]] = {}      # j -> shared units (lazy)
        self.refs: dict[int, list[tuple[object, int]]] = {}        # units j references now
        self.pending: dict[int, list[tuple[object, int]]] = {}     # units to cache after prefill
        self.own_start: dict[int, int] = {}                        # preempted j -> first own block
        self.aborted: set[int] = set()
        self.rejected: list[int] = []                              # never fit in the KV pool
        self.R = np.zeros((6, 0), dtype=_I)
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
        self.step_log: list[tuple[int, int, int, int]] | None = None   # (tokens, seqs, preempted, admitted)

    # -- requests -------------------------------------------------------------------------
    def _ensure(self, cap: int) -> None:
        if cap <= self._cap:
            return
        cap = max(cap, 16, 2 * self._cap)
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

    def load(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
             hash_ids: list[tuple[int, ...]] | None = None, block_tokens: int = 512) -> int:
        """Register requests in bulk (not yet queued; see :meth:`enqueue`). Returns the index
        of the first. Output is clamped to ``max_model_len - prompt`` as vLLM clamps
        ``max_tokens``; the caller refuses prompts of ``max_model_len`` tokens or more."""
        base = self._n
        m = len(prompt_tokens)
        self._ensure(base + m)
        p = np.asarray(prompt_tokens, dtype=_I)
        self.prompt[base: base + m] = p
        self.max_out[base: base + m] = np.maximum(
            1, np.minimum(np.asarray(output_tokens, dtype=_I), self.max_model_len - p))
        if self.caching and hash_ids is not None:
            for i, h in enumerate(hash_ids):
                if len(h):
                    self._hash[base + i] = (tuple(h), block_tokens)
        self._n = base + m
        return base

    def share_requests(self, other: EngineCore) -> None:
        """Use ``other``'s request table (replicas of one deployment: a request lives on one
        replica only, so they can share the per-request arrays instead of copying them)."""
        for name in ("prompt", "max_out", "out", "cached", "t_sched", "t_first", "t_done", "t_last",
                     "_hash", "_units"):
            setattr(self, name, getattr(other, name))
        self._n, self._cap = other._n, other._cap

    def enqueue(self, j: int) -> None:
        """Request ``j`` (from :meth:`load`) arrives: it joins WAITING."""
        self.waiting.append(j)

    def add_request(self, req_id: str, prompt_tokens: int, output_tokens: int,
                    hash_ids: tuple[int, ...] = (), block_tokens: int = 512) -> int:
        """Queue one request (WAITING). Returns its index."""
        j = self.load(np.array([prompt_tokens]), np.array([output_tokens]),
                      [tuple(hash_ids)], block_tokens)
        while len(self.ids) < j:
            self.ids.append(str(len(self.ids)))
        self.ids.append(req_id)
        self._index[req_id] = j
        self.enqueue(j)
        return j

    def _units_of(self, j: int) -> list[tuple[object, int]]:
        u = self._units.get(j)
        if u is None:
            h = self._hash.get(j)
            u = shared_units(h[0], h[1], int(self.prompt[j]), self.bs) if h else []
            self._units[j] = u
        return u

    def abort(self, req_id: str) -> None:
        """Drop a request (client went away): its blocks are freed."""
        j = self._index.get(req_id)
        if j is None or j in self.aborted or not math.isnan(self.t_done[j]):
            return
        self.aborted.add(j)
        if j in self.waiting:
            self.waiting.remove(j)
            return
        pos = np.flatnonzero(self.R[self.IDX] == j)
        if len(pos):
            i = int(pos[0])
            self._free_running(i, keep_own=False)
            self.R = np.delete(self.R, i, axis=1)

    def has_work(self) -> bool:
        return bool(self.R.shape[1] or self.waiting)

    @property
    def num_running(self) -> int:
        return self.R.shape[1]

    def stats(self) -> dict:
        return {
            "num_running": self.R.shape[1],
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
        return int(self.R[self.P].sum()) + self.pool.shared_referenced

    # -- block bookkeeping ---------------------------------------------------------------
    def _free_running(self, i: int, keep_own: bool) -> None:
        """Release the blocks of running column ``i`` (preemption keeps its own unit cached)."""
        R = self.R
        j = int(R[self.IDX, i])
        comp = int(R[self.COMP, i])
        S = int(R[self.S, i])
        p = int(R[self.P, i])
        own = 0
        own_key = None
        if keep_own and self.caching:
            own = min(max(0, comp // self.bs - S), p)
            own_key = ("own", j)
            self.own_start[j] = S
        self.pool.release(self.refs.pop(j, ()), own_key, own, p - own)
        self.pending.pop(j, None)
        self._pool_version += 1

    def _fits(self, j: int) -> tuple[bool, object, int]:
        """Whether WAITING request ``j`` may be admitted now (whole prompt in free blocks)."""
        ntok = int(self.prompt[j] + self.out[j])
        own_start = self.own_start.get(j, -1)
        if not self.caching or (own_start < 0 and j not in self._hash):
            return -(-ntok // self.bs) <= self.pool.free, None, ntok
        own_key = ("own", j) if own_start >= 0 else None
        plan = self.pool.lookup(self._units_of(j), own_key, own_start, (ntok - 1) // self.bs)
        need = max(0, -(-ntok // self.bs) - plan.cached_blocks) + plan.touched_free
        return need <= self.pool.free, plan, ntok

    # -- stepping -------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """One engine step (never the multi-step fast path), for real-time drivers."""
        self.last_emitted = _EMPTY
        adv = self.advance(math.inf, allow_fast=False)
        ids = self.ids
        new_tokens = {ids[j]: 1 for j in self.last_emitted.tolist()}
        return StepOutput(
            duration_s=adv.end_s - self._last_start,
            new_tokens=new_tokens,
            finished=[ids[j] for j in adv.finished],
            num_preempted=adv.num_preempted,
        )

    def advance(self, horizon_s: float = math.inf, allow_fast: bool = True,
                defer: bool = False) -> Advance:
        """Run one step, or a run of decode-only steps that ends at the first step boundary
        at or after ``now + horizon_s`` (when the caller expects an outside event then).
        Advances ``now``; returns what finished at the new ``now``.

        With ``defer``, the step's tokens reach users only when the caller calls
        :meth:`commit` at its end (requests the front end takes in meanwhile go first), and
        a decode run is only planned (``Advance.deferred``): :meth:`commit` applies it, or
        :meth:`truncate_run` first cuts it when a request arrives to an empty WAITING queue
        (the only outside event that can change a decode run: a request queued behind a
        blocked head cannot be admitted before it)."""
        self._last_start = self.now
        if self._run is not None or self._emit is not None:
            raise RuntimeError("commit the pending step first")
        if allow_fast and self.fast:
            adv = self._try_decode_run(horizon_s, defer)
            if adv is not None:
                return adv
        adv = self._step()
        if self._emit is not None and not defer:
            self.commit()
        return adv

    def commit(self) -> np.ndarray:
        """Deliver what the deferred step or decode run emitted (its end has come); returns
        the requests that finished, whose last token reached their user at ``t_done``."""
        if self._run is not None:
            return self.commit_run()
        if self._emit is None:
            return _EMPTY
        end, js, finished = self._emit
        self._emit = None
        seen = self._deliver(end, len(js))
        tf = self.t_first[js]
        first = np.isnan(tf)
        if first.any():
            self.t_first[js[first]] = seen
        if self.record_itl:
            self.itl_chunks.append(seen - self.t_last[js[~first]])
        self.t_last[js] = seen
        if len(finished):
            self.t_done[finished] = seen
        return finished

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
        queue = deque(self.fe_queue)
        fe = self.fe_free
        if self._run is not None:
            start, k, _, _, cum, _ = self._run
            ends = start + cum[:k]
            done = int(np.searchsorted(ends, t, side="right"))
            if done:
                fe = self._fifo_run(fe, ends[:done], self.R.shape[1], queue)[1]
        fe = self._fifo_queue(fe, t, queue)
        self.fe_queue.append((t, self.fe_req))
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
        if self.fe_queue:
            self.fe_free = self._fifo_queue(self.fe_free, end, self.fe_queue)
        self.fe_free = max(self.fe_free, end) + tokens * self.fe_cost
        return self.fe_free

    def _deliver_run(self, ends: np.ndarray, n: int) -> np.ndarray:
        """:meth:`_deliver` for consecutive steps of ``n`` tokens each ending at ``ends``."""
        if not self.fe_cost and not self.fe_req:
            return ends
        out, self.fe_free = self._fifo_run(self.fe_free, ends, n, self.fe_queue)
        return out

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
                s = ntok if ntok < left else left
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
                s = min(ntok - hit, left)
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
            need = R[self.NTOK] - comp
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

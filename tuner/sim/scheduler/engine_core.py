"""One vLLM V1 engine (a replica) stepped in virtual time: :class:`EngineCore`, its
per-request tables, its requests (:meth:`EngineCore.load`, :meth:`EngineCore.add_request`,
:meth:`EngineCore.abort`), its block bookkeeping and the stepping entry points
(:meth:`EngineCore.step`, :meth:`EngineCore.advance`, :meth:`EngineCore.commit`), and the
cache units of a prompt (:func:`shared_units`). The scheduling policy (``policy``), the
multi-step decode runs (``decode_runs``) and the API server's queue (``frontend``) are
mixed in from the modules beside it."""
from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from tuner.sim.calibration import Calibration, load_calibration
from tuner.sim.kvcache import BlockPool
from tuner.sim.scheduler.decode_runs import DecodeRuns
from tuner.sim.scheduler.frontend import FrontEnd
from tuner.sim.scheduler.policy import SchedulePolicy
from tuner.sim.scheduler.steps import _EMPTY, _I, Advance, StepOutput
from tuner.sim.steptime import StepTimer

if TYPE_CHECKING:
    from tuner.sim.memory import MemoryPlan


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


class EngineCore(SchedulePolicy, DecodeRuns, FrontEnd):
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
        config = plan.config
        self.bs = int(config.block_size)
        self.budget = int(config.max_num_batched_tokens)
        self.chunk_cap = int(config.long_prefill_token_threshold or 0)  # --long-prefill-token-threshold (0: none)
        self.max_seqs = int(config.max_num_seqs)
        self.max_model_len = int(config.max_model_len)
        self.pool = BlockPool(plan.num_gpu_blocks, config.enable_prefix_caching)
        self.caching = bool(config.enable_prefix_caching)
        self.fast = fast
        self.record_itl = record_itl
        self.now = 0.0
        # --api-server-count N: N processes share the requests and their tokens, each on its own
        # core; as one queue N times as fast (their work spread evenly over them)
        servers = int(config.api_server_count or 1)
        self.fe_cost = float(getattr(self.calib, "frontend_per_token_s", 0.0)) / servers
        self.fe_req = float(getattr(self.calib, "frontend_per_request_s", 0.0)) / servers
        self.fe_free = 0.0              # when the front end has done all the work merged so far
        self.fe_queue: deque[tuple[float, float]] = deque()   # requests it took in, not yet merged
        self._fe_memo: tuple | None = None  # where the last request's fold of fe_queue stopped
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

"""One vLLM V1 engine (a replica) stepped in virtual time: :class:`EngineCore`. It owns its
request table (:class:`~tuner.sim.scheduler.requests.RequestTable`, shared by the replicas of
one deployment), its scheduler (:class:`~tuner.sim.scheduler.policy.Scheduler`: KV pool,
WAITING queue, running batch, the policy of a step), its step timer and its API server's
queue (:class:`~tuner.sim.scheduler.frontend.FrontEnd`); it moves the virtual clock, runs
steps or decode runs (:mod:`~tuner.sim.scheduler.decode_runs`) and delivers their tokens."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tuner.sim.calibration import Calibration, load_calibration
from tuner.sim.scheduler.decode_runs import Run, plan_run, truncated
from tuner.sim.scheduler.frontend import FrontEnd
from tuner.sim.scheduler.policy import COMPUTED, TOKENS, Scheduler
from tuner.sim.scheduler.requests import RequestTable
from tuner.sim.scheduler.steps import _EMPTY, _I, Advance, StepOutput
from tuner.sim.steptime import StepTimer

if TYPE_CHECKING:
    from tuner.sim.memory import MemoryPlan


class EngineCore:
    """One replica. Requests are numbered in order of :meth:`add_request` (or :meth:`load`);
    times are the core's virtual clock (``now``, seconds), which the caller may move
    forward while the core is idle."""

    def __init__(self, plan: MemoryPlan, profile: Calibration | None = None, *,
                 fast: bool = True, record_itl: bool = False) -> None:
        self.plan = plan
        self.calib = profile if profile is not None else load_calibration(plan.gpu, vllm_version=plan.vllm_version)
        self.timer = StepTimer(plan, self.calib)
        config = plan.config
        self.requests = RequestTable(int(config.max_model_len), bool(config.enable_prefix_caching),
                                     int(config.block_size))
        self.scheduler = Scheduler(config, plan.num_gpu_blocks, self.requests)
        # --api-server-count N: N processes share the requests and their tokens, each on its own
        # core; as one queue N times as fast (their work spread evenly over them)
        servers = int(config.api_server_count or 1)
        self.front = FrontEnd(float(getattr(self.calib, "frontend_per_token_s", 0.0)) / servers,
                              float(getattr(self.calib, "frontend_per_request_s", 0.0)) / servers)
        self.fast = fast
        self.record_itl = record_itl
        self.now = 0.0
        self._emit: tuple | None = None  # a deferred step's tokens, delivered by commit()
        self._last_start = 0.0
        self.last_emitted = _EMPTY      # requests that got a token in the last single step
        self._run: Run | None = None    # planned decode run (see decode_runs)
        self.ids: list[str] = []
        self._index: dict[str, int] = {}
        self.aborted: set[int] = set()
        self.generation_tokens = 0
        self.steps = 0
        self.usage_max = 0.0
        self.itl_chunks: list[np.ndarray] = []
        self.step_log: list[tuple[int, int, int, int]] | None = None   # (tokens, seqs, preempted, admitted)

    # -- requests -------------------------------------------------------------------------
    def load(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
             hash_ids: list[tuple[int, ...]] | None = None, block_tokens: int = 512) -> int:
        """Register requests in bulk (not yet queued; see :meth:`enqueue`). Returns the index
        of the first. Output is clamped to ``max_model_len - prompt`` as vLLM clamps
        ``max_tokens``; the caller refuses prompts of ``max_model_len`` tokens or more."""
        return self.requests.load(prompt_tokens, output_tokens, hash_ids, block_tokens)

    def share_requests(self, other: EngineCore) -> None:
        """Use ``other``'s request table (replicas of one deployment: a request lives on one
        replica only, so they can share the per-request arrays instead of copying them)."""
        self.requests = self.scheduler.requests = other.requests

    def enqueue(self, j: int) -> None:
        """Request ``j`` (from :meth:`load`) arrives: it joins WAITING."""
        self.scheduler.waiting.append(j)

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

    def abort(self, req_id: str) -> None:
        """Drop a request (client went away): its blocks are freed."""
        j = self._index.get(req_id)
        if j is None or j in self.aborted or not math.isnan(self.requests.t_done[j]):
            return
        self.aborted.add(j)
        self.scheduler.remove(j)

    def frontend_admit(self, t: float) -> float:
        """A request reaches the front end at ``t``: when the engine sees it."""
        return self.front.admit(t, self._run, self.scheduler.batch.shape[1])

    def has_work(self) -> bool:
        return bool(self.scheduler.batch.shape[1] or self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    def stats(self) -> dict:
        sched = self.scheduler
        return {
            "num_running": sched.batch.shape[1],
            "num_waiting": len(sched.waiting),
            "kv_cache_usage": sched.pool.usage(),
            "num_preemptions": sched.num_preemptions,
            "prefix_cache_queries": sched.prefix_queries,
            "prefix_cache_hits": sched.prefix_hits,
            "prompt_tokens": sched.prompt_tokens_total,
            "generation_tokens": self.generation_tokens,
        }

    def blocks_in_use(self) -> int:
        """Blocks referenced by running requests (shared units counted once)."""
        return self.scheduler.blocks_in_use()

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
            run = plan_run(self.scheduler, self.timer, self.now, horizon_s)
            if run is not None:
                self._run = run
                end = self.now + float(run[4][run[1] - 1])
                if not defer:
                    return Advance(end, run[1], self.commit_run())
                return Advance(end, run[1], _EMPTY, deferred=True)
        adv = self._step()
        if self._emit is not None and not defer:
            self.commit()
        return adv

    def _step(self) -> Advance:
        """One step: the scheduler's choice, its duration, its tokens (delivered at commit)."""
        start = self.now
        sched = self.scheduler
        scheduled, total, preempted, admitted = sched.schedule(start)
        batch = sched.batch
        if total == 0:
            if not batch.shape[1] and not preempted and sched.waiting:
                return Advance(start, 0, np.array([sched.reject_head(start)], dtype=_I), 0)
            # nothing ran (everything preempted this step); charge the fixed overhead
            self.now = start + self.timer.fixed
            self.steps += 1
            if self.step_log is not None:
                self.step_log.append((0, 0, preempted, 0))
            return Advance(self.now, 1, _EMPTY, preempted)
        computed, tokens = batch[COMPUTED], batch[TOKENS]
        n = batch.shape[1]
        n_seqs = n if total >= n and scheduled.min() > 0 else int(np.count_nonzero(scheduled))
        decode_only = total == n_seqs and n_seqs == n and int((tokens - computed).max()) == 1
        new_computed = computed + scheduled
        context = float(new_computed[scheduled > 0].sum()) if n_seqs < n else float(new_computed.sum())
        attention = float((scheduled * (computed + new_computed + 1)).sum()) * 0.5
        end = start + self.timer.step(total, n_seqs, decode_only, context, attention)
        self.now = end
        self.steps += 1
        if self.step_log is not None:
            self.step_log.append((total, n_seqs, preempted, admitted))
        emitted, finished = sched.update_from_output(new_computed, end)
        if len(emitted):
            self.last_emitted = emitted
            self.generation_tokens += len(emitted)
            self._emit = (end, emitted, finished)   # reach users at commit(): see FrontEnd.deliver
        u = sched.pool.usage()
        if u > self.usage_max:
            self.usage_max = u
        return Advance(end, 1, finished, preempted)

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
        self._run = truncated(self._run, t)
        start, k, _, _, cum, _ = self._run
        return start + float(cum[k - 1])

    def commit(self) -> np.ndarray:
        """Deliver what the deferred step or decode run emitted (its end has come); returns
        the requests that finished, whose last token reached their user at ``t_done``."""
        if self._run is not None:
            return self.commit_run()
        if self._emit is None:
            return _EMPTY
        end, emitted, finished = self._emit
        self._emit = None
        seen = self.front.deliver(end, len(emitted))
        reqs = self.requests
        first = np.isnan(reqs.t_first[emitted])
        if first.any():
            reqs.t_first[emitted[first]] = seen
        if self.record_itl:
            self.itl_chunks.append(seen - reqs.t_last[emitted[~first]])
        reqs.t_last[emitted] = seen
        if len(finished):
            reqs.t_done[finished] = seen
        return finished

    def commit_run(self) -> np.ndarray:
        """Apply the pending decode run; returns the requests that finished at its end."""
        start, k, k_fin, _, cum, remaining = self._run
        self._run = None
        running = self.scheduler.decode(k)
        n = len(running)
        self.generation_tokens += n * k
        seen = self.front.deliver_run(start + cum[:k], n)   # when users get each step's tokens
        reqs = self.requests
        first = np.isnan(reqs.t_first[running])    # a prompt whose last token is computed now
        if first.any():
            reqs.t_first[running[first]] = seen[0]
        if self.record_itl:
            gaps = seen[0] - reqs.t_last[running]
            self.itl_chunks.append(gaps[~first])
            if k > 1:
                self.itl_chunks.append(np.repeat(np.diff(seen), n))
        reqs.t_last[running] = seen[-1]
        self.now = start + float(cum[k - 1])
        self.steps += k
        if self.step_log is not None:
            self.step_log.extend([(n, n, 0, 0)] * k)
        u = self.scheduler.pool.usage()
        if u > self.usage_max:
            self.usage_max = u
        if k == k_fin:
            return self.scheduler.finish(np.flatnonzero(remaining == k), float(seen[-1]))
        return _EMPTY

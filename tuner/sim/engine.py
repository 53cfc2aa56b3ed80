"""The virtual-time engine: R replicas of :class:`EngineCore` behind a router, fed by
an open-loop or closed-loop load, measured the way ``vllm bench serve`` measures.

One event heap, ordered by (time, sequence number), holds request sends and replica step
ends. A replica plans its next step (or run of decode steps, see
:mod:`tuner.sim.scheduler`) when it becomes free and lets it run up to the first step
boundary at or after the next event in the heap; a request that arrives during a step is
seen at the next step's start, as in vLLM's engine loop. A request is sent, reaches its
replica's API server ``request_latency_s`` later (routed then), and reaches the engine when
that front end has taken it in (:meth:`EngineCore.frontend_admit`).

Definitions (``vllm bench serve``): TTFT = first token time − send time; E2E = last token
time − send; TPOT = (E2E − TTFT)/(output − 1) (``RunResult.tpot_s``); queue time = first
scheduled − send; ITL = gaps between a request's tokens; duration = first send → last
completion.
"""
from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

from tuner.core.errors import ConfigRejected
from tuner.runtime.control import RunControl, StopHook
from tuner.runtime.routing import Router
from tuner.serving.load import Concurrency, arrival_times
from tuner.serving.result import RunResult
from tuner.sim.calibration import Calibration, load_calibration
from tuner.sim.memory import plan_memory
from tuner.sim.scheduler import EngineCore, StepOutput  # noqa: F401  (EngineCore is part of this module's API)

if TYPE_CHECKING:
    from tuner.serving.config import Deployment, ServeConfig
    from tuner.serving.load import Load
    from tuner.sim.memory import MemoryPlan
    from tuner.traffic.workload import Workload

_SEND, _KICK, _END, _ARRIVE, _FRONT = 0, 1, 2, 3, 4
_VERSIONS = 1 << 20     # END events carry replica * _VERSIONS + (version mod _VERSIONS)


def simulate(deployment: Deployment, config: ServeConfig, workload: Workload, load: Load, *,
             router: str = "round_robin", stop: StopHook | None = None,
             record_itl: bool = False, profile: Calibration | None = None,
             fast: bool = True) -> RunResult:
    """Replay ``workload`` under ``load`` against the simulated deployment, in virtual time.
    Raises :class:`ConfigRejected` where vLLM would refuse to start."""

    if config.gpus_needed > deployment.gpu_count:
        raise ConfigRejected(
            "layout",
            f"tensor_parallel_size {config.tensor_parallel_size} x replicas {config.replicas} "
            f"needs {config.gpus_needed} GPUs; the deployment has {deployment.gpu_count}",
        )
    plan = plan_memory(deployment, config)
    calib = profile if profile is not None else load_calibration(plan.gpu, deployment.calibration, plan.vllm_version)
    return run_plan(plan, workload, load, replicas=config.replicas, router=router, stop=stop,
                    record_itl=record_itl, profile=calib, fast=fast)


def run_plan(plan: MemoryPlan, workload: Workload, load: Load, *, replicas: int = 1,
             router: str = "round_robin", stop: StopHook | None = None,
             record_itl: bool = False, profile: Calibration | None = None,
             fast: bool = True) -> RunResult:
    """:func:`simulate` for an already computed memory plan (one plan per replica)."""
    n = len(workload)
    cores = [EngineCore(plan, profile, fast=fast, record_itl=record_itl) for _ in range(replicas)]
    # every replica knows every request (request j is column j everywhere); one table shared
    cores[0].load(workload.prompt_tokens, workload.output_tokens, workload.hash_ids, workload.block_tokens)
    for core in cores[1:]:
        core.share_requests(cores[0])
    book = _Book(n)
    too_long = workload.prompt_tokens >= plan.config.max_model_len
    times = arrival_times(load, workload.arrival_s)
    t_last_done, stopped = _event_loop(cores, Router(replicas, router), book, times, load, too_long, stop)
    return _result(plan, workload, load, cores, book, stopped, t_last_done, record_itl)


class _Book:
    """Per request of a run: where it was routed (-1: not yet), when it was sent, whether
    its last token was delivered, and its error (None: served)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.where = np.full(n, -1, dtype=np.int64)
        self.send = np.full(n, np.nan)
        self.delivered = np.zeros(n, dtype=bool)
        self.error: list[str | None] = [None] * n


def _event_loop(cores: list[EngineCore], route: Router, book: _Book, times: np.ndarray | None, load: Load,
                too_long: np.ndarray, stop: StopHook | None) -> tuple[float, bool]:
    """The run's events in time order (sends, arrivals at a front end and at an engine,
    replica kicks and step ends) until every request ended or ``stop`` ends the run; returns
    when the last request ended and whether the stop hook ended it. The simulator's inner
    loop: one function of local names (numpy and the heap), as fast as Python steps it."""
    n, replicas = book.n, len(cores)
    where, send, delivered, error = book.where, book.send, book.delivered, book.error
    closed = times is None
    heap: list[tuple[float, int, int, int]] = []
    seq = 0
    if closed:
        users = min(int(load.users), n) if isinstance(load, Concurrency) else n
        for j in range(users):
            heap.append((0.0, seq, _SEND, j))
            seq += 1
        next_send = users
    else:
        if n:
            heap.append((float(times[0]), seq, _SEND, 0))
            seq += 1
        next_send = 1
    busy = [False] * replicas
    kicked = [False] * replicas
    version = [0] * replicas          # END events of a truncated run are stale
    pending: list[np.ndarray | None] = [None] * replicas
    control = RunControl(total=n)
    t0 = 0.0
    t_last_done = 0.0
    stopped = False

    def finish_one(j: int, t: float, ttft: float) -> bool:
        """Book a finished request (``t``: when its user got the last token, which the
        front end may deliver after the engine's step ended); True when the stop hook
        ends the run."""
        nonlocal seq, next_send, t_last_done
        delivered[j] = True
        t_last_done = max(t_last_done, t)
        control.finished += 1
        control.elapsed_s = t - t0
        if not math.isnan(ttft):
            control.ttft_s.append(ttft)
        if closed and next_send < n:
            heapq.heappush(heap, (t, seq, _SEND, next_send))
            seq += 1
            next_send += 1
        return bool(stop is not None and stop(control))

    # API-server latency: a request reaches the engine this long after it is sent
    # (Calibration.request_latency_s; fitted by tuner calibrate, 0 in the shipped tables).
    latency = float(getattr(cores[0].calib, "request_latency_s", 0.0)) if cores else 0.0
    # the API server takes each request in (Calibration.frontend_per_request_s) in turn with
    # the tokens it streams: the request is routed to a replica's front end, and reaches
    # that replica's engine when its front end has taken it in
    front = bool(cores and cores[0].front.per_request_s)

    while heap:
        t, _, kind, arg = heapq.heappop(heap)
        if kind == _FRONT:
            r = route.pick()
            where[arg] = r
            heapq.heappush(heap, (cores[r].frontend_admit(t), seq, _ARRIVE, arg))
            seq += 1
            continue
        arrived = kind == _ARRIVE
        if arrived:
            kind = _SEND
        if kind == _SEND:
            j = arg
            if not arrived:
                send[j] = t
                control.sent += 1
                if not closed and next_send < n:
                    heapq.heappush(heap, (float(times[next_send]), seq, _SEND, next_send))
                    seq += 1
                    next_send += 1
                if too_long[j]:
                    # vLLM answers 400: "This model's maximum context length is ..."
                    error[j] = "http_400"
                    if finish_one(j, t, math.nan):
                        stopped = True
                        break
                    continue
                if latency > 0 or front:
                    heapq.heappush(heap, (t + latency, seq, _FRONT if front else _ARRIVE, j))
                    seq += 1
                    continue
            if where[j] >= 0:
                r = int(where[j])            # routed when its front end took it in
            else:
                r = route.pick()
                where[j] = r
            core = cores[r]
            if not busy[r] and not core.has_work():
                core.now = max(core.now, t)
            if busy[r] and core.run_pending and not core.scheduler.waiting:
                # the replica is in a decode run that assumed nobody could be admitted:
                # cut it at its first step boundary at or after now
                end = core.truncate_run(t)
                version[r] += 1
                heapq.heappush(heap, (end, seq, _END, r * _VERSIONS + version[r] % _VERSIONS))
                seq += 1
            core.enqueue(j)
            if not busy[r] and not kicked[r]:
                kicked[r] = True
                heapq.heappush(heap, (t, seq, _KICK, r))
                seq += 1
        elif kind == _KICK:
            r = arg
            kicked[r] = False
            if busy[r] or not cores[r].has_work():
                continue
            core = cores[r]
            core.now = max(core.now, t)
            adv = core.advance(math.inf, defer=True)
            busy[r] = True
            pending[r] = adv.finished
            version[r] += 1
            heapq.heappush(heap, (adv.end_s, seq, _END, r * _VERSIONS + version[r] % _VERSIONS))
            seq += 1
        else:  # _END
            r, v = divmod(arg, _VERSIONS)
            if v != version[r] % _VERSIONS:
                continue                      # the run it ended was cut short
            busy[r] = False
            core = cores[r]
            fin = core.commit() if core.commit_pending else pending[r]
            pending[r] = None
            t_first = core.requests.t_first
            t_done = core.requests.t_done
            for j in fin.tolist():
                route.done(r)
                if core.scheduler.rejected and j in core.scheduler.rejected:
                    error[j] = "kv_cache_too_small"
                if finish_one(j, max(t, float(t_done[j])), t_first[j] - send[j]):
                    stopped = True
                    break
            if stopped:
                break
            if core.has_work() and not kicked[r]:
                kicked[r] = True
                heapq.heappush(heap, (t, seq, _KICK, r))
                seq += 1
    return t_last_done, stopped


def _result(plan: MemoryPlan, workload: Workload, load: Load, cores: list[EngineCore], book: _Book,
            stopped: bool, t_last_done: float, record_itl: bool) -> RunResult:
    """The run's per-request records (as ``vllm bench serve`` defines them) and the servers' counters."""
    n, replicas = book.n, len(cores)
    where, send, delivered, error = book.where, book.send, book.delivered, book.error
    prompts = workload.prompt_tokens
    outs = workload.output_tokens
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    queue = np.full(n, np.nan)
    cached = np.zeros(n, dtype=np.int64)
    out_tok = outs.astype(np.int64).copy()
    for r, core in enumerate(cores):
        js = np.flatnonzero(where == r)
        if not len(js):
            continue
        loc = js
        ttft[js] = core.requests.t_first[loc] - send[js]
        e2e[js] = core.requests.t_done[loc] - send[js]
        queue[js] = core.requests.t_sched[loc] - send[js]
        cached[js] = core.requests.cached[loc]
        out_tok[js] = core.requests.max_out[loc]
    for j in range(n):
        if error[j] is not None:
            continue
        if math.isnan(send[j]):
            error[j] = "not_sent"
        elif not delivered[j]:
            # in flight when the stop hook ended the run: what the stop did (UNFINISHED)
            error[j] = "cancelled" if stopped else "aborted"
    ok = np.array([e is None for e in error], dtype=bool)
    ttft[~ok] = np.nan
    e2e[~ok] = np.nan
    sent = ~np.isnan(send)
    t_first_send = float(send[sent].min()) if sent.any() else 0.0
    duration = max(0.0, t_last_done - t_first_send)
    itl = None
    if record_itl:
        chunks = [c for core in cores for c in core.itl_chunks]
        itl = np.concatenate(chunks) if chunks else np.zeros(0)
    queries = sum(c.scheduler.prefix_queries for c in cores)
    hits = sum(c.scheduler.prefix_hits for c in cores)
    server = {
        "kv_cache_usage_max": max(c.usage_max for c in cores),
        "num_preemptions": sum(c.scheduler.num_preemptions for c in cores),
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "prefix_cache_hits": hits,
        "prefix_cache_queries": queries,
        "num_gpu_blocks": int(plan.num_gpu_blocks),
        "kv_cache_tokens": int(plan.kv_cache_tokens),
        "replicas": replicas,
        "engine_steps": sum(c.steps for c in cores),
    }
    return RunResult(
        send_s=send, ttft_s=ttft, e2e_s=e2e, prompt_tokens=prompts.astype(np.int64).copy(),
        output_tokens=out_tok, error=error, duration_s=duration, queue_s=queue,
        cached_tokens=cached, itl_s=itl, server=server, stopped_early=stopped,
        load_label=getattr(load, "label", ""),
    )

"""Streaming load client: offers a :class:`~tuner.traffic.workload.Workload` to one or
more OpenAI-compatible servers (vLLM or ``tuner sim-serve``) and measures what users feel.

The load's schedule and the run's result are here (:func:`replay_async`, :func:`replay`,
:func:`bad_stream_fault`); what a request's measurements mean, and when it succeeds, is
:mod:`tuner.replay.stream`'s; beside them :mod:`tuner.replay.stamping` (kernel stamps),
:mod:`tuner.replay.bodies` (request bodies) and :mod:`tuner.replay.endpoints` (servers).
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from tuner.core.errors import InputError
from tuner.core.urls import redact
from tuner.replay.bodies import _request
from tuner.replay.disruption import StallWatch
from tuner.replay.endpoints import _endpoints, fetch_model
from tuner.replay.metrics import MetricsPoller
from tuner.replay.stamping import _StampingConnector, trace_config
from tuner.replay.stream import _Outcome, stream_request
from tuner.runtime.control import RunControl, StopHook
from tuner.runtime.routing import Router
from tuner.serving.load import Load, arrival_times
from tuner.serving.result import RunResult

if TYPE_CHECKING:
    from tuner.traffic.workload import Workload


APIS = ("completions", "chat")


async def replay_async(
    endpoints: Sequence[str] | str,
    workload: Workload,
    load: Load,
    *,
    model: str | None = None,
    stop: StopHook | None = None,
    router: str = "round_robin",
    timeout_s: float = 600.0,
    metrics: bool = True,
    metrics_interval_s: float = 0.5,
    api: str = "completions",
    record_itl: bool = True,
    salt: int = 0,
    tag: str | None = None,
    api_key: str | None = None,
) -> RunResult:
    """Offer ``workload`` under ``load`` to ``endpoints`` (base URLs, one per replica).

    ``stop(control)`` is called each time a request ends; returning True stops sending,
    cancels requests in flight (error ``cancelled``) and marks unsent ones ``not_sent``.
    ``timeout_s`` bounds each request. ``salt`` changes the unique prompt ids (so a
    second run over the same workload does not hit the first run's prefix cache).
    Request ``i`` carries the header ``X-Request-Id: <tag>-<i>`` (vLLM uses it as its
    request id; ``tuner sim-serve`` keys ``/debug/timings`` by it); ``tag`` defaults to a
    fresh ``tuner-<hex>``. ``api_key`` goes to every endpoint as ``Authorization: Bearer``
    (credentials in a URL are sent the same way, as the header they meant).
    ``duration_s`` of the result is the run's wall time, from just before the first
    request is issued until the last one ends (or the stop ends the run), as
    ``vllm bench serve`` divides by its benchmark's duration.
    """
    if api not in APIS:
        raise InputError(f"unknown api {api!r}", hint="use completions or chat")
    eps = _endpoints(endpoints, api_key)
    urls = [u for u, _ in eps]
    auth = [h for _, h in eps]
    route = Router(len(urls), router)
    n = len(workload)
    times = arrival_times(load, workload.arrival_s)
    outcomes = [_Outcome() for _ in range(n)]
    control = RunControl(total=n)
    stopped = asyncio.Event()
    inflight: set[asyncio.Task] = set()
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    run_tag = tag or f"tuner-{time.time_ns():x}"
    watch = StallWatch()

    connector = _StampingConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace_config()]) as session:
        if model is None:
            model = await fetch_model(session, urls[0], auth[0])
        poller = MetricsPoller(urls, metrics_interval_s, headers=auth) if metrics else None
        polling_done = asyncio.Event()
        poll_task = asyncio.create_task(poller.run(session, polling_done)) if poller else None
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            body, out_len, prompt_len = _request(workload, i, model, api, salt)
            ep = route.pick()
            control.sent += 1
            try:
                await stream_request(
                    session, urls[ep] + path, body, request_id=f"{run_tag}-{i}",
                    timeout_s=timeout_s, out=outcomes[i], t0=t0, record_itl=record_itl,
                    api=api, expect_output=out_len, expect_prompt=prompt_len, headers=auth[ep], watch=watch,
                )
            except asyncio.CancelledError:
                outcomes[i].error = "cancelled"
                raise
            finally:
                route.done(ep)
                if outcomes[i].began:
                    watch.end(time.perf_counter())
            control.finished += 1
            control.elapsed_s = time.perf_counter() - t0
            if outcomes[i].error is None:
                control.ttft_s.append(outcomes[i].ttft)
            if stop is not None and not stopped.is_set() and stop(control):
                stopped.set()

        def launch(i: int) -> asyncio.Task:
            outcomes[i].issue = time.perf_counter() - t0
            task = asyncio.create_task(one(i))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            return task

        async def open_loop(send_at: np.ndarray) -> None:
            for i in range(n):
                # asyncio may wake a timer a hair early: a request is never issued before its time
                while (delay := t0 + float(send_at[i]) - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                if stopped.is_set():
                    return
                launch(i)
            while inflight:
                await asyncio.gather(*list(inflight), return_exceptions=True)

        next_i = 0

        async def user() -> None:
            nonlocal next_i
            while not stopped.is_set() and next_i < n:
                i = next_i
                next_i += 1
                task = launch(i)
                try:
                    await task
                except asyncio.CancelledError:
                    if not stopped.is_set():
                        raise
                    return

        if times is None:
            driver = asyncio.gather(*(user() for _ in range(min(load.users, n) or 1)))
        else:
            driver = asyncio.ensure_future(open_loop(times))
        stop_wait = asyncio.ensure_future(stopped.wait())
        try:
            await asyncio.wait({driver, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if stopped.is_set():
                driver.cancel()
                for task in list(inflight):
                    task.cancel()
                await asyncio.gather(driver, *list(inflight), return_exceptions=True)
            else:
                await driver
        finally:
            ended = time.perf_counter()
            watch.close(ended)
            stop_wait.cancel()
            if not driver.done():  # the replay itself was cancelled (a stop signal): end the users too
                driver.cancel()
            # what the driver raised is collected here, never logged later as "never retrieved"
            driver.add_done_callback(_retrieve)
            for task in list(inflight):
                task.cancel()
            polling_done.set()
            if poll_task is not None:
                await poll_task
        elapsed = ended - t0

    result = _result(workload, outcomes, elapsed, stopped.is_set(), load, poller, record_itl, urls)
    return dataclasses.replace(result, stall_s=watch.longest, stall_at_s=max(0.0, watch.at - t0) if watch.longest else 0.0,
                               stall_streams=watch.streams)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _result(workload, outcomes, elapsed, stopped, load, poller, record_itl, urls) -> RunResult:
    ok = [o.error is None for o in outcomes]
    detail: dict[str, str] = {}
    for o in outcomes:
        if o.error is not None and o.detail and o.error not in detail:
            detail[o.error] = o.detail
    send = np.array([o.send for o in outcomes], dtype=np.float64)
    e2e = np.array([o.e2e for o in outcomes], dtype=np.float64)
    prompt = np.array(
        [o.prompt_tokens if o.prompt_tokens >= 0 else int(workload.prompt_tokens[i])
         for i, o in enumerate(outcomes)], dtype=np.int64)
    output = np.array([max(o.output_tokens, 0) for o in outcomes], dtype=np.int64)
    cached = np.array([o.cached_tokens for o in outcomes], dtype=np.int64)
    itl = None
    if record_itl:
        gaps = [g for o in outcomes if o.error is None and o.itl for g in o.itl]
        itl = np.array(gaps, dtype=np.float64)
    server: dict[str, Any] = {"endpoints": [redact(u) for u in urls]}
    if poller is not None:
        server.update(poller.summary())
    return RunResult(
        send_s=send,
        issue_s=np.array([o.issue for o in outcomes], dtype=np.float64),
        ttft_s=np.array([o.ttft for o in outcomes], dtype=np.float64),
        ttft_kernel_s=np.array([o.ttft_kernel for o in outcomes], dtype=np.float64),
        e2e_s=e2e,
        prompt_tokens=prompt,
        output_tokens=output,
        error=[o.error for o in outcomes],
        duration_s=float(elapsed),
        cached_tokens=cached if (cached >= 0).any() else None,
        itl_s=itl,
        server=server,
        stopped_early=stopped,
        load_label=getattr(load, "label", str(load)),
        error_detail=detail,
    )


def bad_stream_fault(result: RunResult) -> tuple[str, str] | None:
    """``(kind, cause)`` when ``result`` holds implausible streams (``bad_stream``): the
    server's fault, so the run measured nothing; None otherwise."""
    n = result.error_counts().get("bad_stream", 0)
    if not n:
        return None
    return "bad_stream", (f"{n} of {len(result)} streams did not arrive as its usage claims, e.g. "
                          f"{result.error_detail.get('bad_stream', '')}; it is not measured")


def replay(endpoints: Sequence[str] | str, workload: Workload, load: Load, **kwargs: Any) -> RunResult:
    """Blocking :func:`replay_async`. Works inside a running event loop too (notebooks):
    the replay then runs on its own loop in a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(replay_async(endpoints, workload, load, **kwargs))
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = asyncio.run(replay_async(endpoints, workload, load, **kwargs))
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name="tuner-replay")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]

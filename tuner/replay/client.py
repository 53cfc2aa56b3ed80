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
    connector = _StampingConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace_config()]) as session:
        if model is None:
            model = await fetch_model(session, urls[0], auth[0])
        poller = MetricsPoller(urls, metrics_interval_s, headers=auth) if metrics else None
        polling_done = asyncio.Event()
        poll_task = asyncio.create_task(poller.run(session, polling_done)) if poller else None
        run = _Replay(session, workload, urls, auth, model, api=api, router=router, timeout_s=timeout_s,
                      record_itl=record_itl, salt=salt, tag=tag, stop=stop)
        try:
            elapsed = await run.drive(arrival_times(load, workload.arrival_s), load)
        finally:
            polling_done.set()
            if poll_task is not None:
                await poll_task

    watch = run.watch
    result = _result(workload, run.outcomes, elapsed, run.stopped.is_set(), load, poller, record_itl, urls)
    return dataclasses.replace(result, stall_s=watch.longest,
                               stall_at_s=max(0.0, watch.at - run.t0) if watch.longest else 0.0,
                               stall_streams=watch.streams)


class _Replay:
    """One replay's requests in flight: each sent on its schedule (open loop) or by one of
    ``users`` as soon as their last one ended (closed loop), streamed and measured into
    :attr:`outcomes`; the stop hook asked after each."""

    def __init__(self, session: aiohttp.ClientSession, workload: Workload, urls: list[str],
                 auth: list[dict[str, str]], model: str, *, api: str, router: str, timeout_s: float,
                 record_itl: bool, salt: int, tag: str | None, stop: StopHook | None) -> None:
        self.session, self.workload, self.urls, self.auth, self.model = session, workload, urls, auth, model
        self.api, self.timeout_s, self.record_itl, self.salt, self.stop = api, timeout_s, record_itl, salt, stop
        self.route = Router(len(urls), router)
        self.n = len(workload)
        self.outcomes = [_Outcome() for _ in range(self.n)]
        self.control = RunControl(total=self.n)
        self.stopped = asyncio.Event()
        self.inflight: set[asyncio.Task] = set()
        self.path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        self.tag = tag or f"tuner-{time.time_ns():x}"
        self.watch = StallWatch()
        self.next_i = 0
        self.t0 = time.perf_counter()

    async def one(self, i: int) -> None:
        """Request ``i``: streamed to the endpoint the router picks, measured, the stop asked."""
        body, out_len, prompt_len = _request(self.workload, i, self.model, self.api, self.salt)
        ep = self.route.pick()
        control, out = self.control, self.outcomes[i]
        control.sent += 1
        try:
            await stream_request(
                self.session, self.urls[ep] + self.path, body, request_id=f"{self.tag}-{i}",
                timeout_s=self.timeout_s, out=out, t0=self.t0, record_itl=self.record_itl,
                api=self.api, expect_output=out_len, expect_prompt=prompt_len, headers=self.auth[ep],
                watch=self.watch,
            )
        except asyncio.CancelledError:
            out.error = "cancelled"
            raise
        finally:
            self.route.done(ep)
            if out.began:
                self.watch.end(time.perf_counter())
        control.finished += 1
        control.elapsed_s = time.perf_counter() - self.t0
        if out.error is None:
            control.ttft_s.append(out.ttft)
        if self.stop is not None and not self.stopped.is_set() and self.stop(control):
            self.stopped.set()

    def launch(self, i: int) -> asyncio.Task:
        self.outcomes[i].issue = time.perf_counter() - self.t0
        task = asyncio.create_task(self.one(i))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        return task

    async def open_loop(self, send_at: np.ndarray) -> None:
        for i in range(self.n):
            # asyncio may wake a timer a hair early: a request is never issued before its time
            while (delay := self.t0 + float(send_at[i]) - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            if self.stopped.is_set():
                return
            self.launch(i)
        while self.inflight:
            await asyncio.gather(*list(self.inflight), return_exceptions=True)

    async def user(self) -> None:
        while not self.stopped.is_set() and self.next_i < self.n:
            i = self.next_i
            self.next_i += 1
            task = self.launch(i)
            try:
                await task
            except asyncio.CancelledError:
                if not self.stopped.is_set():
                    raise
                return

    async def drive(self, times: np.ndarray | None, load: Load) -> float:
        """Send every request (``times``: the open loop's schedule, None for ``load``'s
        users) until all ended or the stop ends the run; returns the run's wall time."""
        self.t0 = time.perf_counter()
        if times is None:
            driver = asyncio.gather(*(self.user() for _ in range(min(load.users, self.n) or 1)))
        else:
            driver = asyncio.ensure_future(self.open_loop(times))
        stop_wait = asyncio.ensure_future(self.stopped.wait())
        try:
            await asyncio.wait({driver, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if self.stopped.is_set():
                driver.cancel()
                for task in list(self.inflight):
                    task.cancel()
                await asyncio.gather(driver, *list(self.inflight), return_exceptions=True)
            else:
                await driver
        finally:
            ended = time.perf_counter()
            self.watch.close(ended)
            stop_wait.cancel()
            if not driver.done():  # the replay itself was cancelled (a stop signal): end the users too
                driver.cancel()
            # what the driver raised is collected here, never logged later as "never retrieved"
            driver.add_done_callback(_retrieve)
            for task in list(self.inflight):
                task.cancel()
        return ended - self.t0


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _result(workload, outcomes, elapsed, stopped, load, poller, record_itl, urls) -> RunResult:
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

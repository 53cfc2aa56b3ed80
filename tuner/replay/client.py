"""Streaming load client: offers a :class:`~tuner.traffic.workload.Workload` to one or
more OpenAI-compatible servers (vLLM or ``tuner sim-serve``) and measures what users feel.

Definitions follow ``vllm bench serve`` (``benchmarks/lib/endpoint_request_func.py``):
TTFT is send → first chunk whose ``choices`` is non-empty; ITL is the gap between
successive content chunks (a chunk may carry several tokens); E2E is send → last content
chunk; token counts come from the final ``usage`` chunk (``stream_options.include_usage``).
The send is when the request's body is handed to the socket; ``issue_s`` records when
the scheduler started the request (never before its scheduled time, in schedule order),
before any connection set-up that may reorder sends issued close together.

Each request forces its logged output length: ``max_tokens = min_tokens = output`` and
``ignore_eos``. Prompts are token-id lists of the exact logged length
(:mod:`tuner.replay.prompts`). The client stays light: SSE is split on raw bytes and
only the usage chunk is parsed as JSON, so 256 concurrent streams fit in one core.
"""
from __future__ import annotations

import asyncio
import collections
import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from tuner.backends.base import RunControl, StopHook
from tuner.errors import BackendError, InputError
from tuner.load import Load, arrival_times
from tuner.replay.kernel_time import KernelStampedSocket, kernel_stamps
from tuner.replay.metrics import MetricsPoller
from tuner.replay.prompts import prompt_ids, prompt_text
from tuner.replay.routing import Router
from tuner.result import RunResult

if TYPE_CHECKING:
    from tuner.traffic.workload import Workload

APIS = ("completions", "chat")


@dataclass(slots=True)
class _Outcome:
    issue: float = math.nan  # when the scheduler started the request (before any connection set-up)
    send: float = math.nan
    ttft: float = math.nan
    e2e: float = math.nan
    prompt_tokens: int = -1
    output_tokens: int = -1
    cached_tokens: int = -1
    error: str | None = "not_sent"
    itl: list[float] | None = None


def _usage_of(payload: bytes) -> dict[str, Any] | None:
    try:
        return json.loads(payload).get("usage")
    except (ValueError, AttributeError):
        return None


class _StampedBuffer(collections.deque):
    """Stands in for a response StreamReader's buffer: stamps each piece of body as the
    connection's protocol hands it over, with the stream offset it ends at. The stamp is
    the kernel's receive time when the connection has a :class:`KernelStampedSocket`,
    else the time the protocol got the bytes (before the reading task is scheduled)."""

    def __init__(self, items, stamps: collections.deque, kernel: KernelStampedSocket | None) -> None:
        super().__init__(items)
        self.stamps = stamps
        self.kernel = kernel
        self.received = sum(len(x) for x in items)
        if self.received:  # body bytes that came with the headers, before this was installed
            t = kernel.last_stamp if kernel is not None else None
            stamps.append((self.received, t if t is not None else time.perf_counter()))

    def append(self, piece) -> None:
        self.received += len(piece)
        t = self.kernel.last_stamp if self.kernel is not None else None
        self.stamps.append((self.received, t if t is not None else time.perf_counter()))
        super().append(piece)


class _StampingConnector(aiohttp.TCPConnector):
    """A connector whose connections carry kernel receive stamps from their first byte."""

    async def _create_connection(self, req, traces, timeout):  # aiohttp 3.x hook
        proto = await super()._create_connection(req, traces, timeout)
        kernel_stamps(getattr(proto, "transport", None))
        return proto


async def _on_body_sent(session, ctx, params) -> None:
    box = ctx.trace_request_ctx
    if box is not None and box.get("sent") is None:
        box["sent"] = time.perf_counter()


def trace_config() -> aiohttp.TraceConfig:
    """Stamps when a request's body is handed to the socket (``box["sent"]``)."""
    tc = aiohttp.TraceConfig()
    tc.on_request_chunk_sent.append(_on_body_sent)
    return tc


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    request_id: str,
    timeout_s: float,
    out: _Outcome,
    t0: float,
    record_itl: bool = True,
) -> None:
    """POST one streaming request and fill ``out`` (times relative to the send).

    The send time is when the request body is handed to the socket (when the session has
    :func:`trace_config`), else when the POST is issued; chunk times are when their bytes
    reach the connection (:class:`_StampedBuffer`)."""
    itl: list[float] = []
    first = last = None
    chunks = 0
    usage: dict[str, Any] | None = None
    done = False
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
    box: dict[str, float | None] = {"sent": None}
    issued = time.perf_counter()
    out.send = issued - t0
    out.error = None
    stamps: collections.deque = collections.deque()
    try:
        async with session.post(
            url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s),
            trace_request_ctx=box,
        ) as resp:
            if resp.status != 200:
                await resp.read()
                out.error = f"http_{resp.status}"
                return
            try:
                content = resp.content
                content._buffer = _StampedBuffer(content._buffer, stamps, kernel_stamps(resp.connection.transport if resp.connection else None))
            except (AttributeError, TypeError):  # another aiohttp: stamp at read time
                pass
            buf = b""
            consumed = 0  # stream offset of buf[0]
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                buf += data
                start = 0
                while True:
                    k = buf.find(b"\n\n", start)
                    if k < 0:
                        break
                    event = buf[start:k]
                    start = k + 2
                    if not event.startswith(b"data:"):
                        continue
                    payload = event[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                    elif b'"choices":[]' in payload or b'"choices": []' in payload:
                        usage = _usage_of(payload) or usage
                    elif b'"choices"' in payload:
                        t = now
                        if stamps:
                            end = consumed + start
                            while len(stamps) > 1 and stamps[0][0] < end:
                                stamps.popleft()
                            if stamps[0][0] >= end:
                                t = stamps[0][1]
                        if first is None:
                            first = t
                        elif record_itl:
                            itl.append(t - last)
                        last = t
                        chunks += 1
                        if b'"usage":{' in payload or b'"usage": {' in payload:
                            usage = _usage_of(payload) or usage  # continuous usage stats
                    else:  # {"error": ...} or {"object": "error", ...} mid-stream
                        out.error = "stream_error"
                        return
                if start:
                    buf = buf[start:]
                    consumed += start
    except asyncio.TimeoutError:
        out.error = "timeout"
        return
    except (aiohttp.ClientError, ConnectionError, OSError):
        out.error = "disconnect"
        return
    if not done or first is None:
        out.error = "disconnect"
        return
    sent = box["sent"] or issued
    out.send = sent - t0
    out.ttft = first - sent
    out.e2e = last - sent
    out.itl = itl
    if usage:
        out.prompt_tokens = int(usage.get("prompt_tokens", -1))
        out.output_tokens = int(usage.get("completion_tokens", chunks))
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            out.cached_tokens = int(details["cached_tokens"])
    else:
        out.output_tokens = chunks


def _body(workload: Workload, i: int, model: str, api: str, salt: int) -> bytes:
    out_len = max(1, int(workload.output_tokens[i]))
    ids = prompt_ids(workload, i, salt=salt)
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": out_len,
        "min_tokens": out_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        common["messages"] = [{"role": "user", "content": prompt_text(ids)}]
    else:
        common["prompt"] = ids
    return json.dumps(common, separators=(",", ":")).encode()


async def fetch_model(session: aiohttp.ClientSession, base: str) -> str:
    """The first model id ``/v1/models`` lists."""
    try:
        async with session.get(f"{base}/v1/models", timeout=aiohttp.ClientTimeout(total=30)) as resp:
            data = await resp.json()
        return str(data["data"][0]["id"])
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, IndexError, ValueError) as err:
        raise BackendError(
            f"cannot read the model name from {base}/v1/models ({type(err).__name__}: {err}); "
            "is the server up? pass model= to skip this"
        ) from err


def _normalise(endpoints: Sequence[str] | str) -> list[str]:
    if isinstance(endpoints, str):
        endpoints = [endpoints]
    urls = [e.rstrip("/").removesuffix("/v1") for e in endpoints]
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise InputError(f"endpoint {u!r} is not an http(s) URL", hint="write http://host:port")
    return urls


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
) -> RunResult:
    """Offer ``workload`` under ``load`` to ``endpoints`` (base URLs, one per replica).

    ``stop(control)`` is called each time a request ends; returning True stops sending,
    cancels requests in flight (error ``cancelled``) and marks unsent ones ``not_sent``.
    ``timeout_s`` bounds each request. ``salt`` changes the unique prompt ids (so a
    second run over the same workload does not hit the first run's prefix cache).
    Request ``i`` carries the header ``X-Request-Id: <tag>-<i>`` (vLLM uses it as its
    request id; ``tuner sim-serve`` keys ``/debug/timings`` by it); ``tag`` defaults to a
    fresh ``tuner-<hex>``.
    """
    if api not in APIS:
        raise InputError(f"unknown api {api!r}", hint="use completions or chat")
    urls = _normalise(endpoints)
    route = Router(len(urls), router)
    n = len(workload)
    times = arrival_times(load, workload.arrival_s)
    outcomes = [_Outcome() for _ in range(n)]
    control = RunControl(total=n)
    stopped = asyncio.Event()
    inflight: set[asyncio.Task] = set()
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    run_tag = tag or f"tuner-{time.time_ns():x}"

    connector = _StampingConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace_config()]) as session:
        if model is None:
            model = await fetch_model(session, urls[0])
        poller = MetricsPoller(urls, metrics_interval_s) if metrics else None
        polling_done = asyncio.Event()
        poll_task = asyncio.create_task(poller.run(session, polling_done)) if poller else None
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            body = _body(workload, i, model, api, salt)
            ep = route.pick()
            control.sent += 1
            try:
                await stream_request(
                    session, urls[ep] + path, body, request_id=f"{run_tag}-{i}",
                    timeout_s=timeout_s, out=outcomes[i], t0=t0, record_itl=record_itl,
                )
            except asyncio.CancelledError:
                outcomes[i].error = "cancelled"
                raise
            finally:
                route.done(ep)
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
            stop_wait.cancel()
            for task in list(inflight):
                task.cancel()
            polling_done.set()
            if poll_task is not None:
                await poll_task
        elapsed = time.perf_counter() - t0

    return _result(workload, outcomes, elapsed, stopped.is_set(), load, poller, record_itl, urls)


def _result(workload, outcomes, elapsed, stopped, load, poller, record_itl, urls) -> RunResult:
    ok = [o.error is None for o in outcomes]
    send = np.array([o.send for o in outcomes], dtype=np.float64)
    e2e = np.array([o.e2e for o in outcomes], dtype=np.float64)
    ends = send + e2e
    if any(ok):
        duration = float(np.nanmax(ends[ok]) - np.nanmin(send[ok]))
    else:
        duration = float(elapsed)
    prompt = np.array(
        [o.prompt_tokens if o.prompt_tokens >= 0 else int(workload.prompt_tokens[i])
         for i, o in enumerate(outcomes)], dtype=np.int64)
    output = np.array([max(o.output_tokens, 0) for o in outcomes], dtype=np.int64)
    cached = np.array([o.cached_tokens for o in outcomes], dtype=np.int64)
    itl = None
    if record_itl:
        gaps = [g for o in outcomes if o.error is None and o.itl for g in o.itl]
        itl = np.array(gaps, dtype=np.float64)
    server: dict[str, Any] = {"endpoints": list(urls)}
    if poller is not None:
        server.update(poller.summary())
    return RunResult(
        send_s=send,
        issue_s=np.array([o.issue for o in outcomes], dtype=np.float64),
        ttft_s=np.array([o.ttft for o in outcomes], dtype=np.float64),
        e2e_s=e2e,
        prompt_tokens=prompt,
        output_tokens=output,
        error=[o.error for o in outcomes],
        duration_s=duration,
        cached_tokens=cached if (cached >= 0).any() else None,
        itl_s=itl,
        server=server,
        stopped_early=stopped,
        load_label=getattr(load, "label", str(load)),
    )


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

"""Streaming load client: offers a :class:`~tuner.traffic.workload.Workload` to one or
more OpenAI-compatible servers (vLLM or ``tuner sim-serve``) and measures what users feel.

Definitions are ``vllm bench serve``'s (vLLM 0.32, ``vllm/benchmarks/lib/endpoint_request_func.py``
and ``vllm/benchmarks/serve.py``; docs/metrics.md has the page): a request starts at
``time.perf_counter()`` just before the POST (before any connection set-up); TTFT is
start → the first chunk whose ``choices`` is non-empty, timed when the client processes
it; ITL is the gap between successive such chunks, each timed when processed (chunks
read together get gaps of microseconds, as in vLLM); E2E is start → the last such chunk;
token counts come from the final ``usage`` chunk (``stream_options.include_usage``);
throughput divides by the run's wall time (:func:`replay_async`). ``issue_s`` records
when the scheduler started the request (never before its scheduled time, in schedule
order). Beside them, ``ttft_kernel_s`` is tuner's own, closer reading: from when the
request body was handed to the socket to the kernel's receive stamp of the first chunk
(:mod:`tuner.kernel_time`), so neither connection set-up nor a busy event loop
adds to it.

Each request forces its logged output length: ``max_tokens = min_tokens = output`` and
``ignore_eos``. Prompts are token-id lists of the exact logged length
(:mod:`tuner.replay.prompts`). The client stays light: SSE is split on raw bytes and
each ``data:`` payload parsed with ``json.loads``, so 256 concurrent streams fit in one core.

Success is stricter than ``vllm bench serve``'s (HTTP 200 and at least one ``choices``
chunk, nothing raised while reading): a request only counts when its whole answer is a
well-formed stream. Otherwise it is an error of its kind
(:class:`~tuner.result.RunResult`): ``stream_error`` for a line that is not SSE, a
payload that is not JSON or has no ``choices`` list, a choice without a completion's
``text`` (chat: ``delta``), an error object mid-stream, data after ``[DONE]``, a stream
that ends without ``[DONE]``, no usage chunk, or token counts that do not add up (more
output tokens than forced, more content chunks than tokens, for completions a prompt
count other than the ids sent); ``short_output`` for fewer output tokens than forced;
``http_<status>`` for an answer other than 200; ``timeout``; ``disconnect``; ``bad_stream``
for tokens that did not arrive as the usage claims (:data:`MIN_SECONDS_PER_TOKEN`). Of these,
vLLM also fails a payload that is not JSON, a line that is not SSE, an answer other than
200, a timeout and a disconnect; the others it counts as served.
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

from tuner.control import RunControl, StopHook
from tuner.errors import BackendError, InputError
from tuner.kernel_time import KernelStampedSocket, kernel_stamps
from tuner.load import Load, arrival_times
from tuner.replay.metrics import MetricsPoller
from tuner.replay.prompts import prompt_ids, prompt_text
from tuner.result import RunResult
from tuner.routing import Router
from tuner.urls import bearer, redact, split_credentials

if TYPE_CHECKING:
    from tuner.traffic.workload import Workload

APIS = ("completions", "chat")

#: A stream is plausible only if its tokens take the time a decoder takes. Chunks alone do
#: not say it: vLLM sends one token a chunk at light load, a few under high load (a step's
#: tokens of one request leaving together; ``--stream-interval N`` or speculative decoding
#: with k draft tokens put up to N or k + 1 in one), and when its API server falls behind
#: it merges every output not yet sent into one chunk (vLLM 0.26.0 on an H200 at 256
#: users: 2 chunks for 444 tokens, seen in benchmarks/h200). A stream of at least
#: ``PLAUSIBLE_MIN_TOKENS`` that claims more than ``MAX_TOKENS_PER_CHUNK`` tokens a content
#: chunk *and* whose last chunk came sooner after the request than
#: ``MIN_SECONDS_PER_TOKEN`` a claimed token (4,000 tokens a second for one request; the
#: H200 campaign's fastest single user made 557) did not come as decoded tokens do (one
#: instant chunk claiming hundreds of forced tokens): a ``bad_stream``, the server's fault,
#: never a measurement (:func:`bad_stream_fault`).
MAX_TOKENS_PER_CHUNK = 16
PLAUSIBLE_MIN_TOKENS = 32
MIN_SECONDS_PER_TOKEN = 0.25e-3


@dataclass(slots=True)
class _Outcome:
    issue: float = math.nan  # when the scheduler started the request (before any connection set-up)
    send: float = math.nan   # perf_counter just before the POST (vLLM's start_time)
    ttft: float = math.nan
    ttft_kernel: float = math.nan  # body handed to the socket → kernel stamp of the first chunk
    e2e: float = math.nan
    prompt_tokens: int = -1
    output_tokens: int = -1
    cached_tokens: int = -1
    error: str | None = "not_sent"
    itl: list[float] | None = None
    detail: str | None = None  # what was wrong, for an error (short, credentials masked)


class _Bad(Exception):
    """The answer is not a well-formed stream (kind ``stream_error`` unless given)."""

    def __init__(self, detail: str, kind: str = "stream_error") -> None:
        super().__init__(detail)
        self.kind = kind


#: SSE fields other than ``data`` (ignored, as a browser does), and comments (``:``).
_SSE_OTHER = (b"event:", b"id:", b"retry:", b":")


def _quote(raw: bytes, n: int = 60) -> str:
    return repr(raw[:n]) + ("..." if len(raw) > n else "")


def _payload(event: bytes) -> bytes | None:
    """The data of one SSE event (``None`` for an event without data lines)."""
    if event.startswith(b"data:") and b"\n" not in event:  # vLLM's events: one data line
        return event[5:].strip()
    data = []
    for line in event.split(b"\n"):
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            data.append(line[5:].strip())
        elif line and not line.startswith(_SSE_OTHER):
            raise _Bad(f"a line that is not SSE: {_quote(line)}")
    return b"\n".join(data) if data else None


def _check_choices(choices: list, chat: bool) -> int:
    """Content pieces in ``choices`` (non-empty ``text``/``delta.content``); raises _Bad
    for a choice that is not a completion's."""
    pieces = 0
    for c in choices:
        if chat:
            delta = c.get("delta") if isinstance(c, dict) else None
            content = delta.get("content") if isinstance(delta, dict) else 0
            if not (content is None or isinstance(content, str)):
                raise _Bad("a chat choice without a delta (content)")
        else:
            content = c.get("text") if isinstance(c, dict) else None
            if not isinstance(content, str):
                raise _Bad("a completion choice without text")
        pieces += bool(content)
    return pieces


def _count(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Bad(f"the usage chunk's {key} is {value!r}, not a count")
    return value


def _answer_detail(raw: bytes) -> str:
    """The message of an error answer (OpenAI/vLLM ``{"error": {"message": ...}}``), else its start."""
    try:
        data = json.loads(raw)
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message") or err.get("detail") if isinstance(err, dict) else err
        if msg:
            return str(msg)[:160]
    except (ValueError, AttributeError):
        pass
    return raw[:160].decode("utf-8", "replace").strip()


class _StampedBuffer(collections.deque):
    """Stands in for a response StreamReader's buffer: stamps each piece of body as the
    connection's protocol hands it over, with the stream offset it ends at. The stamp is
    the kernel's receive time when the connection has a :class:`KernelStampedSocket`,
    else the time the protocol got the bytes (before the reading task is scheduled).
    Setting ``stamps`` to None stops stamping (once the first chunk is timed)."""

    def __init__(self, items, stamps: collections.deque, kernel: KernelStampedSocket | None) -> None:
        super().__init__(items)
        self.stamps = stamps
        self.kernel = kernel
        self.received = sum(len(x) for x in items)
        if self.received:  # body bytes that came with the headers, before this was installed
            t = kernel.last_stamp if kernel is not None else None
            stamps.append((self.received, t if t is not None else time.perf_counter()))

    def append(self, piece) -> None:
        if self.stamps is not None:
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
    api: str = "completions",
    expect_output: int | None = None,
    expect_prompt: int | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """POST one streaming request and fill ``out`` (see the module docstring).

    TTFT, ITL and E2E are ``vllm bench serve``'s: from ``time.perf_counter()`` just
    before the POST to each content chunk as it is processed. ``ttft_kernel`` is from when
    the request body is handed to the socket (when the session has :func:`trace_config`,
    else the POST's start) to when the first chunk's bytes reached the connection
    (:class:`_StampedBuffer`). ``expect_output`` (the forced output length) and
    ``expect_prompt`` (prompt ids sent) are checked against the usage chunk; any
    departure from a well-formed stream is an error (see the module docstring)."""
    itl: list[float] = []
    first = last = kernel_first = None
    pieces = 0  # content pieces (a chunk carries one or more tokens)
    usage: dict[str, Any] | None = None
    done = False
    chat = api == "chat"
    hdrs = {"Content-Type": "application/json", "X-Request-Id": request_id}
    if headers:
        hdrs.update(headers)
    box: dict[str, float | None] = {"sent": None}
    out.error = None
    stamps: collections.deque = collections.deque()
    stamped: _StampedBuffer | None = None
    st = time.perf_counter()  # vLLM: st = time.perf_counter() just before session.post
    out.send = st - t0
    try:
        async with session.post(
            url, data=body, headers=hdrs, timeout=aiohttp.ClientTimeout(total=timeout_s),
            trace_request_ctx=box,
        ) as resp:
            if resp.status != 200:
                raw = await resp.read()
                raise _Bad(_answer_detail(raw), f"http_{resp.status}")
            try:
                content = resp.content
                stamped = _StampedBuffer(content._buffer, stamps, kernel_stamps(
                    resp.connection.transport if resp.connection else None))
                content._buffer = stamped
            except (AttributeError, TypeError):  # another aiohttp: stamp at read time
                stamped = None
            buf = b""
            consumed = 0  # stream offset of buf[0]
            async for data in resp.content.iter_any():
                read_at = time.perf_counter()
                buf += data
                start = 0
                while True:
                    k = buf.find(b"\n\n", start)
                    if k < 0:
                        break
                    event = buf[start:k]
                    start = k + 2
                    payload = _payload(event)
                    if payload is None:
                        continue
                    if done:
                        raise _Bad(f"data after [DONE]: {_quote(payload)}")
                    if payload == b"[DONE]":
                        done = True
                        continue
                    try:
                        chunk = json.loads(payload)
                    except ValueError:
                        raise _Bad(f"a chunk that is not JSON: {_quote(payload)}") from None
                    if not isinstance(chunk, dict):
                        raise _Bad(f"a chunk that is not a JSON object: {_quote(payload)}")
                    if "error" in chunk or chunk.get("object") == "error":  # {"error": ...} mid-stream
                        raise _Bad("the server sent an error mid-stream: " + _answer_detail(payload))
                    choices = chunk.get("choices")
                    if not isinstance(choices, list):
                        raise _Bad(f"a chunk without a choices list: {_quote(payload)}")
                    u = chunk.get("usage")
                    if u is not None:  # the final usage chunk, or continuous usage stats
                        if not isinstance(u, dict):
                            raise _Bad(f"a usage that is not an object: {_quote(payload)}")
                        usage = u
                    if not choices:
                        continue
                    pieces += _check_choices(choices, chat)
                    t = time.perf_counter()  # vLLM: timestamp = time.perf_counter() per chunk
                    if first is None:
                        first, kernel_first = t, read_at
                        if stamps:
                            end = consumed + start
                            while len(stamps) > 1 and stamps[0][0] < end:
                                stamps.popleft()
                            if stamps[0][0] >= end:
                                kernel_first = stamps[0][1]
                        if stamped is not None:
                            stamped.stamps = None
                        stamps.clear()
                    elif record_itl:
                        itl.append(t - last)
                    last = t
                if start:
                    buf = buf[start:]
                    consumed += start
            if buf.strip():
                raise _Bad(f"the stream ended inside an event: {_quote(buf.strip())}")
            if not done:
                raise _Bad("the stream ended without [DONE]")
            if usage is None:
                raise _Bad("no usage chunk (the request asks for stream_options.include_usage)")
            n_out = _count(usage, "completion_tokens")
            n_prompt = _count(usage, "prompt_tokens")
            if expect_output is not None and n_out < expect_output:
                raise _Bad(f"{n_out} of the {expect_output} output tokens forced", "short_output")
            if expect_output is not None and n_out > expect_output:
                raise _Bad(f"usage says {n_out} output tokens, {expect_output} were forced")
            if pieces > n_out:
                raise _Bad(f"{pieces} content chunks but usage says {n_out} output tokens")
            if expect_prompt is not None and n_prompt != expect_prompt:
                raise _Bad(f"usage says {n_prompt} prompt tokens, {expect_prompt} were sent")
            if first is None:
                raise _Bad(f"usage says {n_out} output tokens, but no content chunk came")
            if (n_out >= PLAUSIBLE_MIN_TOKENS and n_out > MAX_TOKENS_PER_CHUNK * pieces
                    and last - st < n_out * MIN_SECONDS_PER_TOKEN):
                raise _Bad(f"{pieces} content chunk(s), the last {(last - st) * 1e3:.1f} ms after the request, for "
                           f"the {n_out} output tokens its usage claims (a decoder needs at least "
                           f"{n_out * MIN_SECONDS_PER_TOKEN * 1e3:.0f} ms for them)", "bad_stream")
    except _Bad as bad:
        out.error, out.detail = bad.kind, redact(str(bad))
        return
    except asyncio.TimeoutError:
        out.error, out.detail = "timeout", f"no complete answer within {timeout_s:g} s"
        return
    except (aiohttp.ClientError, ConnectionError, OSError) as err:
        out.error, out.detail = "disconnect", redact(f"{type(err).__name__}: {err}")[:160]
        return
    sent = box["sent"] or st
    out.ttft = first - st
    out.ttft_kernel = kernel_first - sent
    out.e2e = last - st
    out.itl = itl
    out.prompt_tokens = n_prompt
    out.output_tokens = n_out
    details = usage.get("prompt_tokens_details") or {}
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        out.cached_tokens = int(details["cached_tokens"])


def _body(workload: Workload, i: int, model: str, api: str, salt: int) -> bytes:
    return _request(workload, i, model, api, salt)[0]


def _request(workload: Workload, i: int, model: str, api: str, salt: int) -> tuple[bytes, int, int | None]:
    """Request ``i``'s body, its forced output length and (completions) its prompt ids' count."""
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
    body = json.dumps(common, separators=(",", ":")).encode()
    return body, out_len, (len(ids) if api != "chat" else None)


async def fetch_model(session: aiohttp.ClientSession, base: str, headers: dict[str, str] | None = None) -> str:
    """The first model id ``/v1/models`` lists."""
    try:
        async with session.get(f"{base}/v1/models", headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            if resp.status in (401, 403):
                raise BackendError(f"{base}/v1/models answered {resp.status}: {_denied(headers)}")
            data = await resp.json()
        return str(data["data"][0]["id"])
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, IndexError, ValueError, TypeError) as err:
        raise BackendError(redact(
            f"cannot read the model name from {base}/v1/models ({type(err).__name__}: {err}); "
            "is the server up? pass model= to skip this"
        )) from err


def _denied(headers: dict[str, str] | None) -> str:
    """What to do about a 401/403."""
    if headers and "Authorization" in headers:
        return ("the server refused the credentials given (check the key in --api-key-file, OPENAI_API_KEY "
                "or VLLM_API_KEY, or the URL's)")
    return "the server wants an API key (give --api-key-file PATH, or set OPENAI_API_KEY or VLLM_API_KEY)"


def _normalise(endpoints: Sequence[str] | str) -> list[str]:
    """Base URLs (``http://host:port``, no ``/v1``, credentials taken out)."""
    return [u for u, _ in _endpoints(endpoints)]


def _endpoints(endpoints: Sequence[str] | str, api_key: str | None = None) -> list[tuple[str, dict[str, str]]]:
    """``(base URL, headers)`` per endpoint: the base without ``/v1`` and without the
    credentials a URL carried; the headers carry ``api_key`` as a bearer token, or else
    the URL's credentials (:func:`tuner.urls.split_credentials`)."""
    if isinstance(endpoints, str):
        endpoints = [endpoints]
    out = []
    for e in endpoints:
        e = str(e).strip()
        if not e.startswith(("http://", "https://")):
            raise InputError(f"endpoint {redact(e)!r} is not an http(s) URL", hint="write http://host:port")
        url, auth = split_credentials(e)
        if "?" in url or "#" in url:
            raise InputError(f"endpoint {redact(e)!r} has a query string",
                             hint="give the base URL (http://host:port); an API key goes in --api-key-file, "
                                  "OPENAI_API_KEY or VLLM_API_KEY")
        if auth is not None and api_key is not None:
            raise InputError(f"endpoint {redact(e)!r} carries credentials and an API key was given too",
                             hint="give one: take them out of the URL, or unset OPENAI_API_KEY/VLLM_API_KEY")
        headers = bearer(api_key) if api_key is not None else ({"Authorization": auth} if auth else {})
        out.append((url.rstrip("/").removesuffix("/v1").rstrip("/"), headers))
    return out


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
                    api=api, expect_output=out_len, expect_prompt=prompt_len, headers=auth[ep],
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
            ended = time.perf_counter()
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

    return _result(workload, outcomes, elapsed, stopped.is_set(), load, poller, record_itl, urls)


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

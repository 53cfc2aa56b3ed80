"""One streaming request, measured: :func:`stream_request` fills an :class:`_Outcome`
with what its user felt, and fails an answer that is not a well-formed stream (:class:`_Bad`).

Definitions are ``vllm bench serve``'s (vLLM 0.32, ``vllm/benchmarks/lib/endpoint_request_func.py``
and ``vllm/benchmarks/serve.py``; docs/metrics.md has the page): a request starts at
``time.perf_counter()`` just before the POST (before any connection set-up); TTFT is
start → the first chunk whose ``choices`` is non-empty, timed when the client processes
it; ITL is the gap between successive such chunks, each timed when processed (chunks
read together get gaps of microseconds, as in vLLM); E2E is start → the last such chunk;
token counts come from the final ``usage`` chunk (``stream_options.include_usage``);
throughput divides by the run's wall time (:func:`~tuner.replay.client.replay_async`). ``issue_s`` records
when the scheduler started the request (never before its scheduled time, in schedule
order). Beside them, ``ttft_kernel_s`` is tuner's own, closer reading: from when the
request body was handed to the socket to the kernel's receive stamp of the first chunk
(:mod:`tuner.runtime.kernel_time`), so neither connection set-up nor a busy event loop
adds to it.

Each request forces its logged output length: ``max_tokens = min_tokens = output`` and
``ignore_eos``. Prompts are token-id lists of the exact logged length
(:mod:`tuner.replay.prompts`). The client stays light: SSE is split on raw bytes and
each ``data:`` payload parsed with ``json.loads``, so 256 concurrent streams fit in one core.

Success is stricter than ``vllm bench serve``'s (HTTP 200 and at least one ``choices``
chunk, nothing raised while reading): a request only counts when its whole answer is a
well-formed stream. Otherwise it is an error of its kind
(:class:`~tuner.serving.result.RunResult`): ``stream_error`` for a line that is not SSE, a
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
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from tuner.core.urls import redact
from tuner.replay.stamping import _StampedBuffer
from tuner.runtime.kernel_time import kernel_stamps

if TYPE_CHECKING:
    from tuner.replay.disruption import StallWatch


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
#: never a measurement (:func:`~tuner.replay.client.bad_stream_fault`).
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
    began: bool = False      # its first content chunk came (the stream is, or was, mid-answer)


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


class _Events:
    """The server-sent events of one answer, parsed as its bytes come (:meth:`feed`): the
    content chunks' times (the first, the last, the gaps), the pieces they carried and the
    usage; :meth:`counts` checks the whole answer once it ended."""

    def __init__(self, chat: bool, record_itl: bool, out: _Outcome, watch: StallWatch | None,
                 stamps: collections.deque, stamped: _StampedBuffer | None) -> None:
        self.chat, self.record_itl, self.out, self.watch = chat, record_itl, out, watch
        self.stamps, self.stamped = stamps, stamped
        self.itl: list[float] = []
        self.first: float | None = None
        self.last: float | None = None
        self.kernel_first: float | None = None
        self.pieces = 0  # content pieces (a chunk carries one or more tokens)
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.buf = b""
        self.consumed = 0  # stream offset of buf[0]

    def feed(self, data: bytes, read_at: float) -> None:
        """The bytes read at ``read_at``: each complete event in them, in order."""
        buf = self.buf = self.buf + data
        start = 0
        while True:
            k = buf.find(b"\n\n", start)
            if k < 0:
                break
            event = buf[start:k]
            start = k + 2
            payload = _payload(event)
            if payload is not None:
                self._payload(payload, self.consumed + start, read_at)
        if start:
            self.buf = buf[start:]
            self.consumed += start

    def _payload(self, payload: bytes, end: int, read_at: float) -> None:
        """One event's data (``end``: the stream offset just after it)."""
        if self.done:
            raise _Bad(f"data after [DONE]: {_quote(payload)}")
        if payload == b"[DONE]":
            self.done = True
            return
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
            self.usage = u
        if choices:
            self.pieces += _check_choices(choices, self.chat)
            self._content(time.perf_counter(), end, read_at)  # vLLM: timestamp = time.perf_counter() per chunk

    def _content(self, t: float, end: int, read_at: float) -> None:
        """A content chunk processed at ``t``: the first (TTFT, and its kernel stamp), or a gap."""
        if self.watch is not None:
            (self.watch.first if self.first is None else self.watch.chunk)(t)
        if self.first is None:
            self.out.began = True
            self.first, self.kernel_first = t, read_at
            stamps = self.stamps
            if stamps:
                while len(stamps) > 1 and stamps[0][0] < end:
                    stamps.popleft()
                if stamps[0][0] >= end:
                    self.kernel_first = stamps[0][1]
            if self.stamped is not None:
                self.stamped.stamps = None
            stamps.clear()
        elif self.record_itl:
            self.itl.append(t - self.last)
        self.last = t

    def counts(self, st: float, expect_output: int | None, expect_prompt: int | None) -> tuple[int, int]:
        """The answer's output and prompt tokens, once it ended; :class:`_Bad` where the
        stream is not whole or its counts do not add up (``st``: the request's start)."""
        if self.buf.strip():
            raise _Bad(f"the stream ended inside an event: {_quote(self.buf.strip())}")
        if not self.done:
            raise _Bad("the stream ended without [DONE]")
        if self.usage is None:
            raise _Bad("no usage chunk (the request asks for stream_options.include_usage)")
        n_out = _count(self.usage, "completion_tokens")
        n_prompt = _count(self.usage, "prompt_tokens")
        if expect_output is not None and n_out < expect_output:
            raise _Bad(f"{n_out} of the {expect_output} output tokens forced", "short_output")
        if expect_output is not None and n_out > expect_output:
            raise _Bad(f"usage says {n_out} output tokens, {expect_output} were forced")
        pieces, last = self.pieces, self.last
        if pieces > n_out:
            raise _Bad(f"{pieces} content chunks but usage says {n_out} output tokens")
        if expect_prompt is not None and n_prompt != expect_prompt:
            raise _Bad(f"usage says {n_prompt} prompt tokens, {expect_prompt} were sent")
        if self.first is None:
            raise _Bad(f"usage says {n_out} output tokens, but no content chunk came")
        if (n_out >= PLAUSIBLE_MIN_TOKENS and n_out > MAX_TOKENS_PER_CHUNK * pieces
                and last - st < n_out * MIN_SECONDS_PER_TOKEN):
            raise _Bad(f"{pieces} content chunk(s), the last {(last - st) * 1e3:.1f} ms after the request, for "
                       f"the {n_out} output tokens its usage claims (a decoder needs at least "
                       f"{n_out * MIN_SECONDS_PER_TOKEN * 1e3:.0f} ms for them)", "bad_stream")
        return n_out, n_prompt


def _stamped(resp: aiohttp.ClientResponse, stamps: collections.deque) -> _StampedBuffer | None:
    """Put a :class:`_StampedBuffer` under the answer's reader (kernel stamps of its bytes);
    None where this aiohttp's reader has no buffer to wrap (stamped at read time instead)."""
    try:
        content = resp.content
        stamped = _StampedBuffer(content._buffer, stamps, kernel_stamps(
            resp.connection.transport if resp.connection else None))
        content._buffer = stamped
        return stamped
    except (AttributeError, TypeError):
        return None


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
    watch: StallWatch | None = None,
) -> None:
    """POST one streaming request and fill ``out`` (see the module docstring). ``watch``
    (:class:`tuner.replay.disruption.StallWatch`) is told of its first chunk, every later
    one and its end, whatever ends it.

    TTFT, ITL and E2E are ``vllm bench serve``'s: from ``time.perf_counter()`` just
    before the POST to each content chunk as it is processed. ``ttft_kernel`` is from when
    the request body is handed to the socket (when the session has :func:`trace_config`,
    else the POST's start) to when the first chunk's bytes reached the connection
    (:class:`_StampedBuffer`). ``expect_output`` (the forced output length) and
    ``expect_prompt`` (prompt ids sent) are checked against the usage chunk; any
    departure from a well-formed stream is an error (see the module docstring)."""
    hdrs = {"Content-Type": "application/json", "X-Request-Id": request_id}
    if headers:
        hdrs.update(headers)
    box: dict[str, float | None] = {"sent": None}
    out.error = None
    stamps: collections.deque = collections.deque()
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
            events = _Events(api == "chat", record_itl, out, watch, stamps, _stamped(resp, stamps))
            async for data in resp.content.iter_any():
                events.feed(data, time.perf_counter())
            n_out, n_prompt = events.counts(st, expect_output, expect_prompt)
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
    out.ttft = events.first - st
    out.ttft_kernel = events.kernel_first - sent
    out.e2e = events.last - st
    out.itl = events.itl
    out.prompt_tokens = n_prompt
    out.output_tokens = n_out
    details = events.usage.get("prompt_tokens_details") or {}
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        out.cached_tokens = int(details["cached_tokens"])

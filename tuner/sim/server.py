"""``tuner sim-serve``: the simulated vLLM engine behind an OpenAI-compatible HTTP server,
in real time.

It accepts ``vllm serve``'s flag names for the knobs the tuner sets (:mod:`tuner.sim.command`),
refuses to start exactly where the memory planner (:func:`tuner.sim.memory.plan_memory`) refuses (vLLM's
message on stderr, exit 1), logs vLLM's startup lines, and serves ``/health``,
``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (streaming SSE in vLLM's
format, with the ``include_usage`` chunk; non-streaming too), ``/metrics`` with vLLM's
metric names, ``/version``, and ``/debug/timings`` (the server's own per-request TTFT and
E2E, keyed by the ``X-Request-Id`` header; used to check the client's measurements: arrival
is the kernel's receive stamp of the request where the connection has one, else when the
handler starts; the first and last token are stamped just before their chunk is handed to
the socket. The client stamps its send before the bytes go out and a chunk by the kernel's
receive stamp, so its TTFT and E2E of a request are never shorter than these).

An asyncio task steps the engine and sleeps each step's simulated duration (divided by
``--speed``), then hands each request the tokens that step produced: one SSE chunk per
request per step, as vLLM sends. The engine is anything with
:class:`tuner.sim.engine.EngineCore`'s methods (tests pass a stand-in).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tuner.runtime.kernel_time import kernel_stamps
from tuner.traffic._text import estimate_tokens

TIMINGS_KEPT = 200_000


@dataclass(slots=True)
class _Live:
    """A request in flight. Streaming ones are written straight from the engine loop
    (``transport``), so all chunks of a step go out in one pass, as fast as the socket
    takes them; the handler only waits for ``finished``."""

    max_tokens: int
    event: asyncio.Event = field(default_factory=asyncio.Event)
    emitted: int = 0
    finished: bool = False
    gone: bool = False              # the client went away
    transport: Any = None           # asyncio transport of a streaming response, else None
    head: str = ""                  # chunk JSON up to the choices list
    chat: bool = False
    first: float | None = None      # perf_counter of the first / last token chunk
    last: float | None = None

    def chunk(self, k: int, done: bool) -> bytes:
        text = " tok" * k
        reason = '"length"' if done else "null"
        if self.chat:
            role = "" if self.emitted > k else (
                self.head + '{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]}\n\n')
            body = (role + self.head + f'{{"index":0,"delta":{{"content":"{text}"}},'
                    f'"logprobs":null,"finish_reason":{reason}}}]}}\n\n')
        else:
            body = (self.head + f'{{"index":0,"text":"{text}","logprobs":null,'
                    f'"finish_reason":{reason},"stop_reason":null}}]}}\n\n')
        data = body.encode()
        return b"%x\r\n%s\r\n" % (len(data), data)  # one HTTP/1.1 chunk


def _block_hashes(ids: list[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks, as vLLM's prefix cache keys them
    (``v1/core/kv_cache_utils.py::hash_block_tokens``: parent hash + the block's ids)."""
    out, parent = [], 0
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(ids[start:start + block_size])))
        out.append(parent)
    return tuple(out)


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    # vLLM's ErrorResponse shape (entrypoints/openai/protocol.py).
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status=status
    )


class SimServer:
    """HTTP front of one engine replica."""

    def __init__(
        self,
        engine: Any,
        *,
        model_name: str,
        max_model_len: int,
        block_size: int = 16,
        num_gpu_blocks: int | None = None,
        speed: float = 1.0,
        vllm_version: str = "sim",
        aliases: tuple[str, ...] = (),
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.names = (model_name, *aliases)  # vLLM: every --served-model-name is listed and answered
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.speed = speed
        self.vllm_version = vllm_version
        self.live: dict[str, _Live] = {}
        self.timings: OrderedDict[str, dict[str, float]] = OrderedDict()
        self.request_success = 0
        self.steps = 0
        self._late: deque[float] = deque(maxlen=100_000)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._model_json = json.dumps(model_name)

    # -- engine loop -----------------------------------------------------------------
    async def _run_engine(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            if not self.engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            start = loop.time()
            out = self.engine.step()
            self.steps += 1
            due = start + max(out.duration_s, 0.0) / self.speed
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif not out.new_tokens and not out.finished:
                await asyncio.sleep(0.001)  # nothing could be scheduled: do not spin
            else:
                await asyncio.sleep(0)
            self._late.append(loop.time() - due)  # > 0: this step ended late (CPU starved)
            finished = set(out.finished)
            perf = time.perf_counter
            for rid, k in out.new_tokens.items():
                live = self.live.get(rid)
                if live is None or not k or live.gone:
                    continue
                live.emitted += k
                tr = live.transport
                if tr is not None and tr.is_closing():
                    self._client_gone(rid, live)
                    continue
                now = perf()  # before the write: the client cannot have the chunk earlier
                if live.first is None:
                    live.first = now
                live.last = now
                if tr is not None:
                    tr.write(live.chunk(k, rid in finished and live.emitted >= live.max_tokens))
            for rid in finished:
                live = self.live.get(rid)
                if live is not None:
                    live.finished = True
                    live.event.set()

    def _client_gone(self, rid: str, live: _Live) -> None:
        live.gone = True
        if not live.finished:
            self.engine.abort(rid)
        live.finished = True
        live.event.set()

    async def _on_startup(self, app: web.Application) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run_engine())

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/debug/timings", self.debug_timings)
        app.router.add_get("/debug/loop", self.debug_loop)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    # -- simple endpoints --------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.vllm_version})

    async def models(self, request: web.Request) -> web.Response:
        cards = [{"id": name, "object": "model", "created": int(time.time()),
                  "owned_by": "vllm", "root": self.model_name, "parent": None,
                  "max_model_len": self.max_model_len, "permission": []} for name in self.names]
        return web.json_response({"object": "list", "data": cards})

    async def debug_timings(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.timings))

    async def debug_loop(self, request: web.Request) -> web.Response:
        """How far behind real time the engine loop ran (seconds a step ended late)."""
        late = sorted(self._late)
        pick = (lambda q: late[min(len(late) - 1, int(q * len(late)))]) if late else (lambda q: 0.0)
        return web.json_response({"steps": self.steps, "late_p50_s": pick(0.5), "late_p95_s": pick(0.95),
                                  "late_max_s": late[-1] if late else 0.0})

    async def metrics(self, request: web.Request) -> web.Response:
        s = self.engine.stats()
        lab = f'engine="0",model_name={self._model_json}'
        rows = [
            ("vllm:num_requests_running", "gauge", s.get("num_running", 0)),
            ("vllm:num_requests_waiting", "gauge", s.get("num_waiting", 0)),
            ("vllm:kv_cache_usage_perc", "gauge", s.get("kv_cache_usage", 0.0)),
            ("vllm:num_preemptions_total", "counter", s.get("num_preemptions", 0)),
            ("vllm:prefix_cache_queries_total", "counter", s.get("prefix_cache_queries", 0)),
            ("vllm:prefix_cache_hits_total", "counter", s.get("prefix_cache_hits", 0)),
            ("vllm:prompt_tokens_total", "counter", s.get("prompt_tokens", 0)),
            ("vllm:generation_tokens_total", "counter", s.get("generation_tokens", 0)),
            ("vllm:request_success_total", "counter", self.request_success),
        ]
        lines = []
        for name, kind, value in rows:
            lines += [f"# HELP {name} (tuner sim-serve)", f"# TYPE {name} {kind}",
                      f"{name}{{{lab}}} {float(value)}"]
        if self.num_gpu_blocks is not None:
            lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                      "# TYPE vllm:cache_config_info gauge",
                      f'vllm:cache_config_info{{block_size="{self.block_size}",'
                      f'engine="0",num_gpu_blocks="{self.num_gpu_blocks}"}} 1.0']
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # -- generation --------------------------------------------------------------------
    @staticmethod
    def _arrival(request: web.Request) -> float:
        """When the request reached this host: the kernel's receive stamp of its bytes where
        the connection has one (from its second request on), else now."""
        now = time.perf_counter()
        stamped = kernel_stamps(request.transport)
        if stamped is not None and stamped.last_stamp is not None:
            return min(now, stamped.last_stamp)
        return now

    def _words(self, text: str) -> int:
        # No tokenizer here: the traffic package's estimate (4 characters a token for
        # Latin text, 1.4 for CJK), as when a log holds text but no token counts.
        return estimate_tokens(text)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrival = self._arrival(request)
        try:
            body = await request.json()
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
                prompt = prompt[0]  # batched prompts: the simulator serves the first
            if isinstance(prompt, str):
                ids: list[int] = []
                n_prompt = self._words(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                ids = prompt
                n_prompt = len(ids)
            else:
                return _error(400, "prompt must be a string or a non-empty list of token ids")
        except (ValueError, AttributeError):
            return _error(400, "request body is not valid JSON")
        return await self._generate(request, body, arrival, ids, n_prompt, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrival = self._arrival(request)
        try:
            body = await request.json()
            text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        except (ValueError, AttributeError):
            return _error(400, "request body is not valid JSON with messages")
        return await self._generate(request, body, arrival, [], self._words(text), chat=True)

    async def _generate(self, request, body, arrival, ids, n_prompt, *, chat: bool):
        if body.get("model") not in (None, *self.names):
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        max_tokens = self._max_tokens(body, n_prompt, chat)
        if not isinstance(max_tokens, int):
            return max_tokens
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        if rid in self.live:
            rid = f"{rid}-{uuid.uuid4().hex[:8]}"
        hashes = _block_hashes(ids, self.block_size) if ids else ()
        stream = bool(body.get("stream"))
        cid = ("chatcmpl-" if chat else "cmpl-") + rid
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (f'data: {{"id":{json.dumps(cid)},"object":"{obj}","created":{created},'
                f'"model":{self._model_json},"choices":[')
        live = _Live(max_tokens=max_tokens, head=head, chat=chat)
        resp: web.StreamResponse | None = None
        timing: dict[str, float] = {"arrival": arrival, "prompt_tokens": n_prompt, "output_tokens": 0}
        try:
            if stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
                resp.enable_chunked_encoding()
                await resp.prepare(request)
                live.transport = request.transport
            self.live[rid] = live
            self.engine.add_request(rid, n_prompt, max_tokens, hashes, self.block_size)
            assert self._wake is not None
            self._wake.set()
            while not live.finished:
                await live.event.wait()
                live.event.clear()
            if live.gone:
                raise ConnectionResetError("client went away")
            usage_chunk = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._answer(resp, live, n_prompt, cid, created, usage_chunk)
        except (ConnectionError, asyncio.CancelledError):
            if not live.finished and rid in self.live:
                self.engine.abort(rid)
            raise
        finally:
            self.live.pop(rid, None)
            if live.first is not None:
                timing.update(first=live.first, last=live.last, ttft_s=live.first - arrival,
                              e2e_s=live.last - arrival, output_tokens=live.emitted)
            self.timings[rid] = timing
            while len(self.timings) > TIMINGS_KEPT:
                self.timings.popitem(last=False)

    def _max_tokens(self, body: dict, n_prompt: int, chat: bool) -> int | web.Response:
        """The tokens to generate (clamped to the room left, as vLLM does), or vLLM's 400 for
        a request longer than max-model-len (entrypoints/openai/serving_engine.py::_validate_input)."""
        limit = self.max_model_len
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or (
            limit - n_prompt if chat else 16)
        if n_prompt + int(max_tokens) > limit:
            if n_prompt >= limit:
                return _error(400, (
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{n_prompt + int(max_tokens)} tokens ({n_prompt} in the messages, "
                    f"{int(max_tokens)} in the completion). Please reduce the length of the "
                    "messages or completion."))
            max_tokens = limit - n_prompt
        return int(max_tokens)

    async def _answer(self, resp: web.StreamResponse | None, live: _Live, n_prompt: int, cid: str, created: int,
                      usage_chunk: bool) -> web.StreamResponse:
        """The end of a finished request's answer: the stream's usage chunk and [DONE], or
        the whole JSON answer; an error where the engine dropped it."""
        emitted, chat, obj = live.emitted, live.chat, "chat.completion.chunk" if live.chat else "text_completion"
        if emitted == 0:
            # the engine dropped it (prompt larger than the whole KV cache; vLLM would hang)
            message = (f"prompt of {n_prompt} tokens does not fit in the KV cache "
                       f"({self.num_gpu_blocks} blocks of {self.block_size} tokens)")
            if resp is None:
                return _error(500, message, "InternalServerError")
            err = json.dumps({"error": {"message": message, "type": "InternalServerError",
                                        "param": None, "code": 500}})
            await resp.write(f"data: {err}\n\ndata: [DONE]\n\n".encode())
            await resp.write_eof()
            return resp
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + emitted, "completion_tokens": emitted}
        self.request_success += 1
        if resp is not None:
            tail = ""
            if usage_chunk:
                tail = (f'data: {{"id":{json.dumps(cid)},"object":"{obj}","created":{created},'
                        f'"model":{self._model_json},"choices":[],'
                        f'"usage":{json.dumps(usage, separators=(",", ":"))}}}\n\n')
            await resp.write((tail + "data: [DONE]\n\n").encode())
            await resp.write_eof()
            return resp
        text = " tok" * emitted
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        return web.json_response({"id": cid, "object": "chat.completion" if chat else "text_completion",
                                  "created": created, "model": self.model_name, "choices": [choice], "usage": usage})


if __name__ == "__main__":  # python -m tuner.sim.server (command lines written before the split) runs
    import runpy  # the command line, tuner.sim.command, which imports this module: run, not imported back

    runpy.run_module("tuner.sim.command", run_name="__main__", alter_sys=True)

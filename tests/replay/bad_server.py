"""A stand-in OpenAI-compatible server that answers badly on purpose, for the tests of
strict stream parsing, error kinds and API keys (real process on loopback).

The model a request names picks how it is answered (``/v1/models`` lists ``--mode``
first, so a client that reads the model name gets that mode):

* ``ok`` — a well-formed vLLM stream: one chunk per token, the usage chunk, ``[DONE]``
* ``garbage`` — every token chunk is broken JSON containing ``"choices"``; usage and
  ``[DONE]`` are fine
* ``no_done`` / ``no_usage`` — a good stream without ``[DONE]`` / without the usage chunk
* ``short`` — half the tokens forced, usage saying so; ``overcount`` — usage claims more
* ``error_chunk`` — one token, then vLLM's ``{"error": ...}`` chunk and ``[DONE]``
* ``not_sse`` — a line that is not SSE in the stream
* ``http_429`` / ``http_500`` — that status, with an OpenAI-style error body
* ``hang`` — one chunk, then nothing (the connection stays open)
* ``reset`` — one chunk, then the connection is dropped
* ``instant`` — one chunk holding every forced token's text at once, usage claiming them all
  (an implausible stream); ``grouped`` — chunks of 1 and 2 tokens by turns (1.5 per chunk,
  as vLLM under high load); ``spec`` — 5 tokens to a chunk (speculative decoding, 4 drafts);
  ``merged`` — one token, then the rest in one chunk after the time they take to decode (vLLM
  whose API server fell behind merges the outputs it has not sent)

``--key K``: ``/v1/*`` answers 401 unless ``Authorization: Bearer K`` (or Basic
credentials whose password is K) comes with it; ``/debug/auth`` counts both.
Run: ``python bad_server.py --port N [--mode ok] [--key K] [--step-s 0.001]``.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys

from aiohttp import web

MODES = ("ok", "garbage", "no_done", "no_usage", "short", "overcount", "error_chunk", "not_sse",
         "http_429", "http_500", "hang", "reset", "instant", "grouped", "spec", "merged")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "Error", "param": None, "code": status}},
                             status=status)


class BadServer:
    def __init__(self, mode: str, key: str | None, step_s: float) -> None:
        self.mode = mode
        self.key = key
        self.step_s = step_s
        self.auth = {"ok": 0, "refused": 0}

    def _authorised(self, request: web.Request) -> bool:
        if self.key is None:
            return True
        header = request.headers.get("Authorization", "")
        good = header == f"Bearer {self.key}"
        if header.startswith("Basic "):
            try:
                good = base64.b64decode(header[6:]).decode().split(":", 1)[1] == self.key
            except (ValueError, IndexError):
                good = False
        self.auth["ok" if good else "refused"] += 1
        return good

    @web.middleware
    async def guard(self, request: web.Request, handler):
        if request.path.startswith("/v1/") and not self._authorised(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard])
        app.router.add_get("/health", lambda r: web.Response(status=200))
        app.router.add_get("/metrics", lambda r: web.Response(text="vllm:num_requests_running{engine=\"0\"} 0.0\n"))
        app.router.add_get("/debug/auth", lambda r: web.json_response(self.auth))
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        return app

    async def models(self, request: web.Request) -> web.Response:
        names = [self.mode, *(m for m in MODES if m != self.mode)]
        return web.json_response({"object": "list", "data": [{"id": n, "object": "model", "max_model_len": 4096}
                                                             for n in names]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        mode = body.get("model") if body.get("model") in MODES else self.mode
        chat = request.path.endswith("/chat/completions")
        if mode.startswith("http_"):
            status = int(mode[5:])
            return _error(status, "rate limit reached" if status == 429 else "internal server error")
        forced = int(body.get("max_tokens") or 16)
        prompt = body.get("prompt")
        n_prompt = len(prompt) if isinstance(prompt, list) else 8
        n_out = forced // 2 if mode == "short" else forced
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head = '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":['
        sizes = {"instant": [n_out], "grouped": [1, 2] * n_out, "spec": [5] * n_out,
                 "merged": [1, n_out]}.get(mode, [1] * n_out)
        groups, left = [], n_out
        for k in sizes:
            if left <= 0:
                break
            groups.append(min(k, left))
            left -= groups[-1]
        for i, k in enumerate(groups):
            text = " tok" * k
            if chat:
                choice = '{"index":0,"delta":{"content":"%s"},"finish_reason":null}' % text
            else:
                choice = '{"index":0,"text":"%s","logprobs":null,"finish_reason":null}' % text
            chunk = head + choice + "]}"
            if mode == "garbage":
                chunk = chunk[:-12]  # broken JSON, still holding "choices"
            await resp.write(f"data: {chunk}\n\n".encode())
            if i == 0 and mode == "error_chunk":
                err = json.dumps({"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}})
                await resp.write(f"data: {err}\n\ndata: [DONE]\n\n".encode())
                return resp
            if i == 0 and mode == "not_sse":
                await resp.write(b"hello there\n\n")
            if i == 0 and mode == "hang":
                await asyncio.sleep(3600)
            if i == 0 and mode == "reset":
                request.transport.abort()
                return resp
            if self.step_s:
                await asyncio.sleep(self.step_s * (n_out - 1 if mode == "merged" else 1))
        if mode != "no_usage":
            claimed = n_out + 5 if mode == "overcount" else n_out
            usage = {"prompt_tokens": n_prompt, "completion_tokens": claimed, "total_tokens": n_prompt + claimed}
            await resp.write(f"data: {head}],\"usage\":{json.dumps(usage)}}}\n\n".encode())
        if mode != "no_done":
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=MODES, default="ok")
    p.add_argument("--key", default=None)
    p.add_argument("--step-s", type=float, default=0.001)
    args, _unknown = p.parse_known_args(argv)
    web.run_app(BadServer(args.mode, args.key, args.step_s).app(), host=args.host, port=args.port,
                print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

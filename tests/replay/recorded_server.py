"""A stand-in that plays one recorded completions stream with known timings, for the test
that tuner's metrics are ``vllm bench serve``'s (real process on loopback).

Times after the request reaches the handler (seconds; ``--scale`` multiplies them):

* 0.00 response headers
* 0.15 an SSE comment and a chunk with an empty ``choices`` list (no content, no usage)
* 0.30 the first content chunk, with empty text (a choice all the same)
* 0.60 two content chunks in one write (read together)
* 0.90 the last content chunk
* 1.40 the usage chunk (4 completion tokens) and ``data: [DONE]``

The model a request names picks a variant: ``ok`` as above; ``no_done`` without
``[DONE]``; ``garbage`` with the last content chunk's JSON cut short; ``no_content``
with no content chunk at all (usage and ``[DONE]`` only). ``/debug/writes`` gives, per
``X-Request-Id``, the handler's start and when each write was handed to the socket
(``perf_counter``). Run: ``python recorded_server.py --port N [--scale 1.0]``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from aiohttp import web

MODES = ("ok", "no_done", "garbage", "no_content")
HEAD = '{"id":"cmpl-r","object":"text_completion","created":1,"model":"m","choices":'


def _chunk(text: str) -> str:
    choice = json.dumps([{"index": 0, "text": text, "logprobs": None, "finish_reason": None}])
    return f"data: {HEAD}{choice}}}\n\n"


def recording(mode: str) -> list[tuple[float, str]]:
    """``(seconds after arrival, bytes written then)`` of one answer."""
    last = _chunk(" c")
    if mode == "garbage":
        last = last[:-12] + "\n\n"  # broken JSON that still holds "choices"
    usage = f'data: {HEAD}[],"usage":{{"prompt_tokens":8,"completion_tokens":4,"total_tokens":12}}}}\n\n'
    events = [(0.15, ": ping\n\n" + f"data: {HEAD}[]}}\n\n"),
              (0.30, _chunk("")),
              (0.60, _chunk(" a") + _chunk(" b")),
              (0.90, last),
              (1.40, usage + ("" if mode == "no_done" else "data: [DONE]\n\n"))]
    if mode == "no_content":
        events = [events[0], (1.40, usage + "data: [DONE]\n\n")]
    return events


class RecordedServer:
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.writes: dict[str, dict] = {}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", lambda r: web.Response(status=200))
        app.router.add_get("/v1/models", lambda r: web.json_response(
            {"object": "list", "data": [{"id": m, "object": "model"} for m in MODES]}))
        app.router.add_get("/debug/writes", lambda r: web.json_response(self.writes))
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def completions(self, request: web.Request) -> web.StreamResponse:
        start = time.perf_counter()
        body = await request.json()
        mode = body.get("model") if body.get("model") in MODES else "ok"
        record = {"start": start, "writes": []}
        self.writes[request.headers.get("X-Request-Id", f"anon-{len(self.writes)}")] = record
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for at, data in recording(mode):
            await asyncio.sleep(max(0.0, start + at * self.scale - time.perf_counter()))
            record["writes"].append(time.perf_counter())
            await resp.write(data.encode())
        await resp.write_eof()
        return resp


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--scale", type=float, default=1.0)
    args, _unknown = p.parse_known_args(argv)
    web.run_app(RecordedServer(args.scale).app(), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

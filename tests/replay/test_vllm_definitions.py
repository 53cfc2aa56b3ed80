"""tuner's metrics are ``vllm bench serve``'s: one recorded stream with known timings
(recorded_server.py: an SSE comment and an empty-choices chunk, a first content chunk
with empty text, two chunks in one write, a last chunk, then usage and ``[DONE]`` half a
second later) is measured by the replayer and, at the same time, by vLLM's definitions
written out below; TTFT, the ITL list, TPOT, E2E and success agree, and both agree with
when the server wrote each piece.

vLLM's definitions (vLLM 0.32, ``vllm/benchmarks/lib/endpoint_request_func.py``,
``async_request_openai_completions``, and ``vllm/benchmarks/serve.py``,
``calculate_metrics``): the start is ``time.perf_counter()`` just before the POST; the
body is split into SSE messages on blank lines, comments (``:``) and ``[DONE]`` skipped,
every other message parsed as JSON (a parse error fails the request); a message whose
``choices`` is non-empty is a token chunk, timed by ``perf_counter()`` when processed:
the first gives TTFT, each later one an ITL (the gap since the previous token chunk); a
message without choices but with ``usage`` gives the output tokens; E2E ("latency") is
the last token chunk's time minus the start; success is HTTP 200 with at least one token
chunk; TPOT = (E2E − TTFT) / (output tokens − 1) for outputs over one token.

Event spacing is 300 ms or more; the bounds allow 150 ms of scheduling jitter.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import aiohttp
import numpy as np
import pytest
from stand_ins import start_recorded, stop_stub

from tuner.replay import replay_async
from tuner.serving.load import Concurrency
from tuner.traffic.workload import Workload

JITTER_S = 0.15


async def vllm_measure(url: str, model: str, request_id: str) -> dict:
    """One request measured by ``vllm bench serve``'s definitions (module docstring)."""
    out = {"success": False, "ttft": 0.0, "itl": [], "latency": 0.0, "output_tokens": 0}
    body = {"model": model, "prompt": "hi", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    st = time.perf_counter()
    latest = st
    first_seen = False
    try:
        async with aiohttp.ClientSession() as session, session.post(
                url + "/v1/completions", json=body, headers={"x-request-id": request_id}) as resp:
            if resp.status != 200:
                return out
            pending = ""
            async for data in resp.content.iter_any():
                pending += data.decode()
                *messages, pending = pending.split("\n\n")
                for message in (m.strip() for m in messages):
                    if not message or message.startswith(":"):
                        continue
                    payload = message.removeprefix("data: ")
                    if payload == "[DONE]":
                        continue
                    chunk = json.loads(payload)
                    if chunk.get("choices"):
                        now = time.perf_counter()
                        if first_seen:
                            out["itl"].append(now - latest)
                        else:
                            first_seen = True
                            out["ttft"] = now - st
                        latest = now
                    elif chunk.get("usage"):
                        out["output_tokens"] = chunk["usage"]["completion_tokens"]
    except (ValueError, aiohttp.ClientError):
        return out
    out["success"] = first_seen
    out["latency"] = latest - st
    n = out["output_tokens"]
    out["tpot"] = (out["latency"] - out["ttft"]) / (n - 1) if n > 1 else 0.0
    return out


def _both(url: str, mode: str) -> tuple:
    """The replayer and vLLM's definitions on the same recorded answer, at the same time."""
    w = Workload(arrival_s=np.zeros(1), prompt_tokens=np.full(1, 8), output_tokens=np.full(1, 4))

    async def run():
        return await asyncio.gather(
            replay_async(url, w, Concurrency(1), model=mode, metrics=False, tag=f"tuner-{mode}"),
            vllm_measure(url, mode, f"vllm-{mode}"))

    ours, theirs = asyncio.run(run())
    with urllib.request.urlopen(url + "/debug/writes", timeout=10) as resp:
        writes = json.load(resp)
    return ours, theirs, writes


@pytest.fixture(scope="module")
def recorded():
    proc, url = start_recorded()
    try:
        yield url
    finally:
        stop_stub(proc)


def test_a_well_formed_stream_measures_as_vllm_measures_it(recorded):
    ours, theirs, writes = _both(recorded, "ok")
    assert ours.error == [None] and theirs["success"]
    assert int(ours.output_tokens[0]) == theirs["output_tokens"] == 4
    for key in ("tuner-ok-0", "vllm-ok"):
        # what the server did, on the same clock: gaps between the writes that carry token
        # chunks (the third write holds two chunks: a gap of zero), TTFT to the first, E2E
        # to the last; the usage chunk and [DONE] come 0.5 s after the last token chunk
        w = writes[key]
        t = np.array(w["writes"]) - w["start"]
        server = {"ttft": t[1], "itl": [t[2] - t[1], 0.0, t[3] - t[2]], "latency": t[3]}
        client = (theirs if key == "vllm-ok" else
                  {"ttft": ours.ttft_s[0], "itl": list(ours.itl_s), "latency": ours.e2e_s[0]})
        # a client starts before the server's handler and reads after the write
        assert server["ttft"] <= client["ttft"] < server["ttft"] + JITTER_S, key
        assert server["latency"] <= client["latency"] < server["latency"] + JITTER_S, key
        assert client["latency"] < t[4], key  # E2E ends at the last token chunk, not at [DONE]
        assert len(client["itl"]) == 3, key
        assert np.allclose(client["itl"], server["itl"], atol=JITTER_S), (key, client["itl"], server["itl"])
    # and the two agree with each other, TPOT included
    assert ours.ttft_s[0] == pytest.approx(theirs["ttft"], abs=JITTER_S)
    assert ours.e2e_s[0] == pytest.approx(theirs["latency"], abs=JITTER_S)
    assert np.allclose(ours.itl_s, theirs["itl"], atol=JITTER_S)
    assert ours.tpot_s[0] == pytest.approx(theirs["tpot"], abs=JITTER_S / 3)
    # tuner's kernel-stamped TTFT lies inside vLLM's interval and is never shorter than the server's
    assert writes["tuner-ok-0"]["writes"][1] - writes["tuner-ok-0"]["start"] <= ours.ttft_kernel_s[0] <= ours.ttft_s[0]
    s = ours.summary()
    assert s["ttft_p95_s"] == pytest.approx(ours.ttft_s[0]) and "ttft_kernel_p95_s" in s
    # throughput divides by the run's wall time, which holds the usage chunk and [DONE]
    assert ours.duration_s >= writes["tuner-ok-0"]["writes"][4] - writes["tuner-ok-0"]["start"]


def test_tuner_fails_a_stream_without_done_that_vllm_counts(recorded):
    ours, theirs, _ = _both(recorded, "no_done")
    assert theirs["success"] and len(theirs["itl"]) == 3  # vLLM: any token chunk is a success
    assert ours.error == ["stream_error"] and "[DONE]" in ours.error_detail["stream_error"]  # stricter


@pytest.mark.parametrize("mode", ["garbage", "no_content"])
def test_both_fail_a_broken_chunk_and_a_stream_without_tokens(recorded, mode):
    ours, theirs, _ = _both(recorded, mode)
    assert not theirs["success"]
    assert ours.error == ["stream_error"] and np.isnan(ours.ttft_s[0])

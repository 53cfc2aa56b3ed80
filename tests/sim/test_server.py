"""tuner sim-serve's HTTP layer, in process (aiohttp's test server) with a stand-in
engine, and its command line against the real memory planner."""
from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tuner.core.errors import ConfigRejected
from tuner.replay.metrics import parse_prometheus
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.command import build_parser, build_server, main
from tuner.sim.memory import plan_memory
from tuner.sim.server import SimServer, _block_hashes

_spec = importlib.util.spec_from_file_location(
    "stub_server", Path(__file__).resolve().parents[1] / "replay" / "stub_server.py")
stub_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stub_server)


def _run(coro_fn, engine, **kw):
    async def go():
        server = SimServer(engine, model_name="m", max_model_len=kw.pop("max_model_len", 256),
                           num_gpu_blocks=100, **kw)
        async with TestClient(TestServer(server.app())) as client:
            return await coro_fn(client, server)
    return asyncio.run(go())


def _events(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_streaming_completion_is_vllms_sse_with_a_usage_chunk():
    async def go(client, server):
        resp = await client.post("/v1/completions", json={
            "model": "m", "prompt": list(range(40)), "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}, headers={"X-Request-Id": "r1"})
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = _events(await resp.text())
        timing = await (await client.get("/debug/timings")).json()
        return events, timing, server.engine.added
    events, timing, added = _run(go, stub_server.StubEngine(step_s=0.002))
    content, usage, done = events[:-2], events[-2], events[-1]
    assert len(content) == 5 and all(e["choices"][0]["text"] == " tok" for e in content)
    assert [e["choices"][0]["finish_reason"] for e in content] == [None] * 4 + ["length"]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 40
    assert usage["usage"]["completion_tokens"] == 5 and done == "[DONE]"
    assert timing["r1"]["output_tokens"] == 5 and 0 < timing["r1"]["ttft_s"] <= timing["r1"]["e2e_s"]
    # 40 ids in blocks of 16: two full blocks hashed, the tail is not
    assert added[0][3] == _block_hashes(list(range(40)), 16) and len(added[0][3]) == 2


def test_shared_prefixes_give_shared_block_hashes():
    a = _block_hashes([1] * 16 + [2] * 16, 16)
    b = _block_hashes([1] * 16 + [3] * 16, 16)
    c = _block_hashes([9] * 16 + [2] * 16, 16)
    assert a[0] == b[0] and a[1] != b[1]
    assert a[1] != c[1]  # chained: same block after a different prefix is another block


def test_non_streaming_and_chat():
    async def go(client, server):
        plain = await (await client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3})).json()
        chat = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 2, "stream": True})
        return plain, _events(await chat.text())
    plain, chat = _run(go, stub_server.StubEngine(step_s=0.001))
    assert plain["choices"][0]["text"] == " tok" * 3 and plain["usage"]["completion_tokens"] == 3
    assert chat[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in chat[:-1]) == " tok tok"


def test_too_long_prompt_is_refused_with_vllms_message_and_output_is_clamped():
    async def go(client, server):
        too_long = await client.post("/v1/completions", json={"prompt": list(range(300)), "max_tokens": 5})
        clamped = await (await client.post("/v1/completions",
                                           json={"prompt": list(range(250)), "max_tokens": 50})).json()
        return too_long.status, await too_long.json(), clamped
    status, body, clamped = _run(go, stub_server.StubEngine(step_s=0.001))
    assert status == 400 and "maximum context length is 256 tokens" in body["error"]["message"]
    assert clamped["usage"]["completion_tokens"] == 6  # 256 - 250


def test_metrics_use_vllms_names():
    async def go(client, server):
        return await (await client.get("/metrics")).text()
    m = parse_prometheus(_run(go, stub_server.StubEngine()))
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert name in m
    assert m["vllm:cache_config_info"][0][0]["num_gpu_blocks"] == "100"


def test_client_going_away_aborts_the_request():
    class Recording(stub_server.StubEngine):
        aborted: list = []

        def abort(self, req_id):
            self.aborted.append(req_id)
            super().abort(req_id)

    async def go(client, server):
        resp = await client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 200, "stream": True},
                                 headers={"X-Request-Id": "gone"})
        await resp.content.readline()
        resp.close()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if server.engine.aborted:
                break
        return server.engine.aborted, server.engine.has_work()
    aborted, busy = _run(go, Recording(step_s=0.01))
    assert aborted == ["gone"] and not busy


def test_refusal_prints_the_planners_message_and_exits_1(capsys):
    dep = Deployment(model="qwen2.5-7b", gpu="H100-SXM")
    cfg = ServeConfig(max_model_len=200_000)
    with pytest.raises(ConfigRejected) as refused:
        plan_memory(dep, cfg)
    expected = refused.value
    code = main(["qwen2.5-7b", "--gpu", "H100-SXM", "--max-model-len", "200000"])
    assert code == 1
    assert expected.message in capsys.readouterr().err


def test_flags_map_onto_the_planner_like_vllm_serve():
    args = build_parser().parse_args(["qwen2.5-7b", "--gpu", "H100-SXM", "--max-model-len", "4096",
                                      "--max-num-seqs", "32", "--no-enable-prefix-caching", "-tp", "1"])
    server = build_server(args)
    plan = server.engine.plan
    assert (plan.config.max_model_len, plan.config.max_num_seqs, plan.config.enable_prefix_caching) == (4096, 32, False)
    assert server.num_gpu_blocks == plan.num_gpu_blocks and server.max_model_len == 4096


def test_old_versions_leave_prefix_caching_off_by_default():
    args = build_parser().parse_args(["qwen2.5-7b", "--gpu", "H100-SXM", "--max-model-len", "4096",
                                      "--vllm-version", "0.6.3"])
    assert build_server(args).engine.plan.config.enable_prefix_caching is False


def test_unknown_flag_exits_2_like_argparse():
    with pytest.raises(SystemExit) as err:
        main(["qwen2.5-7b", "--not-a-vllm-flag"])
    assert err.value.code == 2

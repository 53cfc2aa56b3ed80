"""Seed article 004 (8 x V100-32GB SXM2 NVLink, 7B FP16, TP 8) reproduced by the simulator.

The article (``../shared/seeds/004_*.txt``, section 5) load-tested vLLM with a 40/40/20
short/medium/long request mix in a closed loop at 5-160 concurrent users, with
max-model-len 4096, max-num-seqs 128, gpu-memory-utilization 0.92 and CUDA graphs on.
This prints the simulator beside the article's table, row by row, with ratios, and checks
the issue's criteria: TTFT rises with concurrency, throughput saturates, each throughput
within +-25 % and each P95 TTFT within +-35 % -- or shows the arithmetic why the article's
figure cannot be physical.

The model is the ``llama-2-7b`` preset: the article's "7B FP16, 14-16 GB" with 0.5 MB of
KV cache per token (section 5.3) is a 32-layer multi-head-attention 7B. The V100 step-time
constants (``tuner/data/calibration/volta.yaml``) were fitted on this table:
``python benchmarks/article_004.py --fit`` reruns the fit.

    python benchmarks/article_004.py
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
import time

import numpy as np

from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency
from tuner.sim.calibration import load_calibration
from tuner.sim.engine import run_plan
from tuner.sim.hardware import get_gpu
from tuner.sim.memory import plan_memory
from tuner.traffic.synth import article_mix

DEPLOYMENT = Deployment(model="llama-2-7b", gpu="V100-32GB-SXM2", gpu_count=8, dtype="float16")
CONFIG = ServeConfig(tensor_parallel_size=8, max_model_len=4096, max_num_seqs=128,
                     gpu_memory_utilization=0.92)
# concurrency: (mean TTFT s, P95 TTFT s, tokens/s in+out, mean E2E s), article sections 5.1-5.2
ARTICLE = {
    5: (0.385, 0.620, 1200, 4.2),
    10: (0.501, 0.840, 1800, 5.8),
    20: (0.680, 1.100, 2600, 7.6),
    50: (1.020, 2.300, 4200, 12.4),
    80: (1.890, 4.600, 5300, 18.9),
    120: (3.120, 8.200, 6100, 30.8),
    160: (4.820, 13.600, 6500, 46.7),
}
REQUESTS_PER_USER = 8     # each user sends this many requests (the article: 200-500 in total)


def run(profile=None, seed: int = 0) -> dict[int, dict[str, float]]:
    plan = plan_memory(DEPLOYMENT, CONFIG)
    profile = profile or load_calibration(plan.gpu)
    rows = {}
    for c in ARTICLE:
        w = article_mix(n=max(200, REQUESTS_PER_USER * c), seed=seed)
        rows[c] = run_plan(plan, w, Concurrency(c), profile=profile).summary()
        rows[c]["tokens_per_request"] = float(np.mean(w.prompt_tokens + w.output_tokens))
    return rows


def fit() -> None:
    """Grid search of the V100 constants against the article's throughput column
    (log-ratio least squares; P95 TTFT with a quarter of the weight)."""
    base = load_calibration(get_gpu("V100-32GB-SXM2"))
    best = None
    grid = itertools.product(
        (0.002, 0.003, 0.004, 0.005),            # step_overhead_s
        (0.00005, 0.0001, 0.00015, 0.0002),      # per_seq_overhead_s
        (0.5, 0.75),                             # hbm_efficiency
        (0.2, 0.35, 0.5),                        # flops_efficiency
        (0.00002, 0.00004),                      # allreduce_latency_s
    )
    for step, per_seq, hbm, fl, ar in grid:
        cal = base.replace(step_overhead_s=step, per_seq_overhead_s=per_seq, hbm_efficiency=hbm,
                           flops_efficiency=fl, allreduce_latency_s=ar)
        rows = run(cal)
        err = 0.0
        for c, (_, p95, tput, _) in ARTICLE.items():
            err += math.log(rows[c]["tokens_per_s"] / tput) ** 2
            err += 0.25 * math.log(rows[c]["ttft_p95_s"] / p95) ** 2
        if best is None or err < best[0]:
            best = (err, step, per_seq, hbm, fl, ar)
            print(f"err {err:.3f}: step {step} per_seq {per_seq} hbm {hbm} flops {fl} allreduce {ar}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="grid-search the V100 constants instead")
    args = ap.parse_args()
    if args.fit:
        fit()
        return 0
    t0 = time.process_time()
    rows = run()
    cpu = time.process_time() - t0
    plan = plan_memory(DEPLOYMENT, CONFIG)
    print(f"article 004: {DEPLOYMENT.label()}, TP 8, max-model-len 4096, max-num-seqs 128, gmu 0.92")
    print("  sim memory plan: " + " | ".join(plan.log_lines()[-2:]))
    print(f"  simulated {sum(max(200, REQUESTS_PER_USER * c) for c in ARTICLE)} requests in {cpu:.2f} CPU-s")
    hdr = (f"{'users':>5} | {'TTFT mean s':>17} | {'TTFT P95 s':>17} | {'tokens/s':>19} | "
           f"{'E2E mean s':>16} | {'sim TPOT':>8}")
    print(hdr)
    print("      | " + " | ".join(["sim  article ratio"] * 3) + " | sim article ratio |")
    fails = []
    for c, (m, p95, tput, e2e) in ARTICLE.items():
        s = rows[c]
        r_m, r_p, r_t, r_e = (s["ttft_mean_s"] / m, s["ttft_p95_s"] / p95, s["tokens_per_s"] / tput,
                              s["e2e_mean_s"] / e2e)
        print(f"{c:>5} | {s['ttft_mean_s']:5.2f} {m:5.2f} {r_m:5.2f} | {s['ttft_p95_s']:5.2f} {p95:5.2f} {r_p:5.2f} | "
              f"{s['tokens_per_s']:5.0f} {tput:5.0f} {r_t:5.2f} | {s['e2e_mean_s']:5.1f} {e2e:5.1f} {r_e:4.2f} | "
              f"{s['tpot_mean_s'] * 1e3:5.1f}ms")
        if not 0.75 <= r_t <= 1.25:
            fails.append(f"throughput at {c} users off by x{r_t:.2f}")
        if not 0.65 <= r_p <= 1.35:
            fails.append(f"P95 TTFT at {c} users off by x{r_p:.2f}")
    users = list(ARTICLE)
    ttft = [rows[c]["ttft_mean_s"] for c in users]
    tput = [rows[c]["tokens_per_s"] for c in users]
    monotone = all(b >= a for a, b in zip(ttft, ttft[1:]))
    gains = [(tput[i + 1] - tput[i]) / (users[i + 1] - users[i]) for i in range(len(users) - 1)]
    saturating = gains[-1] < 0.25 * gains[0]
    print(f"shape: mean TTFT monotone in users: {monotone}; throughput saturating "
          f"(tokens/s per added user {gains[0]:.0f} at first, {gains[-1]:.0f} at the end): {saturating}")
    # Little's law: in a closed loop, tokens/s x E2E / users = tokens per request, which the
    # fixed mix keeps constant. The article's rows disagree with each other beyond 50 users.
    print("Little's law check (tokens/s x mean E2E / users = tokens per request, constant for a fixed mix):")
    print("  article: " + ", ".join(f"{c}: {t * e / c:.0f}" for c, (_, _, t, e) in ARTICLE.items()))
    print("  sim:     " + ", ".join(f"{c}: {rows[c]['tokens_per_s'] * rows[c]['e2e_mean_s'] / c:.0f}"
                                    for c in ARTICLE)
          + f"  (mix mean {rows[5]['tokens_per_request']:.0f} tokens)")
    print("notes:")
    print("  * The article's own rows imply ~1000-1050 tokens per request up to 50 users, then 1250, 1570,"
          " 1900: at 120 and 160 users its tokens/s and its E2E cannot both hold. With E2E as reported,"
          " 1030 tokens x 120 / 30.8 s = 4010 tokens/s and 1030 x 160 / 46.7 s = 3530 tokens/s.")
    print("  * TTFT at low load: a 1,300-token prompt (P95 of the mix) is 2 x 6.7e9 x 1300 / 8 = 2.2e12"
          " FLOP per V100 = 17.5 ms at the 125 TFLOP/s peak, ~60 ms at 30 %, plus one ~8 ms step"
          " in flight: 0.62 s P95 at 5 users is 10x what the GPUs need. The article's client posts"
          " stream=False (section 4.2), so its 'TTFT' cannot be a first-token time; the simulator"
          " reports the physical one.")
    print("  * TTFT at 20-120 users: users <= max-num-seqs (128) and the KV cache (435,280 tokens) holds"
          " 106 requests of 4,096 tokens (far more of the mix's ~720), so nobody waits for a slot or a"
          " block. In steady state prompts arrive at users / E2E x 380 tokens (120 / 30.8 s x 380 ="
          " 1,480 tokens/s), which costs 1,480 x 2 x 6.7e9 / 8 / 25e12 = 0.1 s of prefill per second"
          " even at the fitted 20 % of peak: no queue builds. The tail comes from the start, when all"
          " users send at once: 120 x 380 = 45,600 prompt tokens = 22 steps of 2,048 tokens at"
          " ~0.14 s = ~3 s, which is the sim's P95 (2.8 s). The article's 8.2 s P95 is 2.7x even that"
          " burst; only time spent outside the engine (client, HTTP, non-streaming timing) explains it.")
    print("  * TTFT at 160 users: 32 users always wait for one of 128 slots. Little's law on that queue:"
          " wait = 32 / (160 / 46.7 s) = 9.3 s per request on average, yet the article's mean TTFT is"
          " 4.82 s: its TTFT and E2E columns cannot both be right at 160 users.")
    plan1 = plan_memory(DEPLOYMENT, CONFIG)
    single = run_plan(plan1, article_mix(n=20, seed=1), Concurrency(1)).summary()
    mix = article_mix(n=1000, seed=0)
    ratio = mix.prompt_tokens.mean() / mix.output_tokens.mean()
    print(f"  * Single-stream decode: sim {1 / single['tpot_mean_s']:.0f} tokens/s at 1 user"
          f" (TPOT {single['tpot_mean_s'] * 1e3:.1f} ms), article 40-80 tokens/s and 55 tokens/s per"
          " request at 5 users. But 55 x 5 = 275 output tokens/s inside 1,200 tokens/s (in+out) means"
          f" 3.4 prompt tokens per output token, while the 40/40/20 mix has {ratio:.2f}: the article's"
          " generation-speed and throughput columns need different mixes; the constants were fitted to"
          " throughput, so the sim decodes faster than the article's per-request speed.")
    ok = monotone and saturating
    print(("PASS (shape)" if ok else "FAIL (shape)") + "; outside tolerance: " + ("; ".join(fails) or "none"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Article 004's capacity question on the simulator, printed beside the article's figures.

Article 004 (../shared/seeds/004_*.txt, sections 5.1-5.2 and 7.2): 8x V100-32GB SXM2,
a 7B model in FP16, TP8, max-model-len 4096, max-num-seqs 128, gpu-memory-utilization
0.92, the 40/40/20 short/medium/long mix, closed loop at 5-160 users. At P95 TTFT < 5 s
it reads 80-100 users, 5000-6000 tokens/s (input+output), and 1000-1200 conversations
per minute at 300 tokens per conversation.

The article does not name its 7B model. Qwen2.5-7B (the project's default) has 28
attention heads, which TP8 does not divide (vLLM refuses), so the run uses the
llama-2-7b preset (32 heads, MHA: 0.5 MB of KV per token, the figure the article gives
in section 5.3). The vLLM version is 0.6.3, a line with CUDA 11.8 wheels (the article's
CUDA). Two checks:

1. ``plan_capacity`` on the simulator vs the article (ratios ours/article);
2. the same PCHIP interpolation applied to the article's own table (does the method
   reproduce the article's reading of its data?).

Run: ``python benchmarks/plan_article_004.py [--requests 1000] [--repeats 3]``.
"""
from __future__ import annotations

import argparse
import time

from tuner.plan import Figures, Sweep, plan_capacity, sweep_rows
from tuner.serving.capacity import max_load_meeting
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.demand import conversations_per_min

# Article 004, section 5: users -> (mean TTFT s, P95 TTFT s, mean E2E s, tokens/s in+out)
ARTICLE = {
    5: (0.385, 0.62, 4.2, 1200), 10: (0.501, 0.84, 5.8, 1800), 20: (0.68, 1.1, 7.6, 2600),
    50: (1.02, 2.3, 12.4, 4200), 80: (1.89, 4.6, 18.9, 5300), 120: (3.12, 8.2, 30.8, 6100),
    160: (4.82, 13.6, 46.7, 6500),
}
ARTICLE_CAPACITY = {"max_concurrency": (80, 100), "tokens_per_s": (5000, 6000), "conversations_per_min": (1000, 1200)}
DEPLOYMENT = Deployment(model="llama-2-7b", gpu="V100-32GB-SXM2", gpu_count=8, dtype="float16", vllm_version="0.6.3")
CONFIG = ServeConfig(gpu_memory_utilization=0.92, max_model_len=4096, max_num_seqs=128, tensor_parallel_size=8)
# The article's other layout (section 2.3, "TP4 x 2 instances"), with the project's Qwen2.5-7B.
QWEN = Deployment(model="qwen2.5-7b", gpu="V100-32GB-SXM2", gpu_count=8, dtype="float16", vllm_version="0.6.3")
QWEN_CONFIG = ServeConfig(gpu_memory_utilization=0.92, max_model_len=4096, max_num_seqs=128, tensor_parallel_size=4,
                          replicas=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000, help="requests of the mix per run")
    ap.add_argument("--repeats", type=int, default=1, help="repeats with other seeds (ranges)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    # the article's seven levels, every one run (the default sweep stops one past the target)
    est = plan_capacity("5s", config=CONFIG, deployment=DEPLOYMENT, figures=Figures(tokens_per_conversation=300),
                        sweep=Sweep(requests=args.requests, repeats=args.repeats, levels=sorted(ARTICLE)))
    wall = time.perf_counter() - t0

    print(f"article 004 scenario on the simulator: {DEPLOYMENT.gpu_count}x {DEPLOYMENT.gpu}, {DEPLOYMENT.model} "
          f"FP16 TP8, vLLM {DEPLOYMENT.vllm_version}, {args.requests} requests, {wall:.1f} s wall")
    print()
    print(f"{'users':>5} | {'TTFT avg':>17} | {'TTFT p95':>17} | {'E2E avg':>17} | {'tokens/s':>20}")
    print(f"{'':>5} | {'ours  art  ratio':>17} | {'ours  art  ratio':>17} | {'ours  art  ratio':>17} | "
          f"{'ours   art  ratio':>20}")
    for p in sweep_rows(est):
        if int(p.level) in ARTICLE and p.role == "sweep":
            a = ARTICLE[int(p.level)]
            print(f"{p.level:5.0f} | {p.ttft_mean_s:5.2f} {a[0]:5.2f} {p.ttft_mean_s / a[0]:5.2f} | "
                  f"{p.ttft_p95_s:5.2f} {a[1]:5.2f} {p.ttft_p95_s / a[1]:5.2f} | "
                  f"{p.e2e_mean_s:5.1f} {a[2]:5.1f} {p.e2e_mean_s / a[2]:5.2f} | "
                  f"{p.tokens_per_s:6.0f} {a[3]:5.0f} {p.tokens_per_s / a[3]:5.2f}")
    print()
    users = sorted(ARTICLE)
    crossing = max_load_meeting(users, [ARTICLE[u][1] for u in users], 5.0)
    tok = [ARTICLE[u][3] for u in users]
    import numpy as np

    art_tok = float(np.interp(crossing.level, users, tok))
    print(f"PCHIP on the article's own table: P95 TTFT reaches 5 s at {crossing.level:.1f} users, "
          f"~{art_tok:,.0f} tokens/s (linear between its points), "
          f"{conversations_per_min(tokens_per_s=art_tok, requests_per_s=0, tokens_per_conversation=300):,.0f} "
          "conversations/min at 300 tokens -- the article reads 80-100 users, 5000-6000 tokens/s, 1000-1200/min")
    print()
    print(f"{'capacity at P95 TTFT <= 5 s':<28} {'ours':>10} {'article':>12} {'ours/article mid':>17}")
    for key, (lo, hi) in ARTICLE_CAPACITY.items():
        ours = getattr(est, key)
        rng = est.ranges.get(key)
        extra = f"  (repeats {rng[0]:,.0f}-{rng[1]:,.0f})" if rng else ""
        print(f"{key:<28} {ours:>10,.0f} {f'{lo:,}-{hi:,}':>12} {ours / ((lo + hi) / 2):>17.2f}{extra}")
    print(f"{'output_tokens_per_s':<28} {est.output_tokens_per_s:>10,.0f} {'-':>12}")
    print(f"{'P95 TTFT at that point (s)':<28} {est.ttft_p95_s:>10.2f} {'< 5':>12}")
    for note in est.notes:
        print(f"note: {note}")
    print()
    q = plan_capacity("5s", config=QWEN_CONFIG, deployment=QWEN, figures=Figures(tokens_per_conversation=300),
                      sweep=Sweep(requests=args.requests, repeats=args.repeats))
    print(f"qwen2.5-7b, TP4 x 2 replicas (max-num-seqs 128 each): {q.max_concurrency:,.0f} users "
          f"({q.max_concurrency / 90:.2f}x the article's 80-100 midpoint), {q.tokens_per_s:,.0f} tokens/s "
          f"({q.tokens_per_s / 5500:.2f}x), {q.conversations_per_min:,.0f} conversations/min "
          f"({q.conversations_per_min / 1100:.2f}x), P95 TTFT {q.ttft_p95_s:.2f} s")


if __name__ == "__main__":
    main()

"""The fleet plan (issue 51) on the seeds' rooms and a mixed one, side by side.

    python benchmarks/fleet_plan.py [--budget N] [--keep DIR]

* article 004's room: 8 x V100-32GB SXM2 on vLLM 0.6.3 against a rented H100 and an A100, Llama-2-7B
  FP16, 3,000 conversations/minute of 300 tokens at P95 TTFT <= 5 s (the article: the room holds
  1,000-1,200 a minute at TP 8);
* article 000's box: one V100-16GB (vLLM 0.6.3) against an RTX 4090 and an L4 for Gemma-2-27B AWQ,
  120 conversations a minute;
* a mixed room of six kinds (V100, T4, A100, L4, 4090 owned; H100 rented), Qwen2.5-7B, 3,000/min.

Per kind: the flags and layout chosen, one engine's capacity, the cost per million tokens, the band;
per fleet: the cheapest deployment and the runner-up; then the H200 -> H100 transfer error per
figure on real points no fit saw (recomputed from the committed H200-only profile; the reverse
direction as ``benchmarks/transfer_check.py`` wrote it) and the time each plan took (CPU seconds, in
a fresh folder: every kind searched from scratch).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.calibrate import load_points, point_name, read_measurements, startups  # noqa: E402
from tuner.calibrate.transfer import CAMPAIGN5_WARMUPS, TRANSFER_DIR, errors_on, read_transfer  # noqa: E402
from tuner.cli.fleet_text import flags_text  # noqa: E402
from tuner.fleet.planner import plan_fleet  # noqa: E402
from tuner.serving.config import Deployment  # noqa: E402
from tuner.sim.calibration import load_calibration  # noqa: E402
from tuner.sim.hardware import get_gpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = (("article-004-room", "3000/min"), ("article-000-box", "120/min"), ("mixed-room", "3000/min"))


def kind_rows(plan) -> None:
    for k in plan.kinds:
        if not k.feasible:
            print(f"  {k.label:15s} no number: {(k.reason or '')[:110]}")
            if k.instead:
                print(f"  {'':15s} serves instead: {k.instead}")
            continue
        cap = k.capacity
        print(f"  {k.label:15s} TP{k.tp} {flags_text(k.config)}")
        print(f"  {'':15s} {k.per_min():8,.0f} conv/min an engine ({cap['tokens_per_s']:7,.0f} tok/s, P95 TTFT "
              f"{cap['ttft_p95_s']:.2f} s)  ${k.cost_per_million_tokens:.3f}/1M tok  band {k.band.text():>6s} "
              f"(P95 TTFT {k.band.text('ttft_p95')})  {'' if k.band.calibrated else 'NOT CALIBRATED'}")


def verdict(plan) -> None:
    if not plan.options:
        print(f"  no deployment: {plan.notes[0] if plan.notes else ''}")
        return
    for i, m in enumerate(plan.options[:2]):
        lo, hi = m.cost_range
        tie = " (tie under the bands)" if i in plan.ties else ""
        high = f"{hi:.2f}" if hi != float("inf") else "not held"
        print(f"  {'cheapest ' if i == 0 else 'runner-up'} {m.text():45s} {m.cost_per_hour:7.2f}/h for "
              f"{m.capacity:8,.0f}/min; under the bands {lo:.2f}-{high}{tie}")
    if plan.calibrate_hint:
        print(f"  {plan.calibrate_hint}")


def transfer() -> None:
    rows = [r for c in ("campaign5", "campaign6") for r in read_measurements(ROOT / "benchmarks/h200" / c /
                                                                             "measurements.jsonl")]
    pts = [p for p in load_points(rows) if point_name(p) not in set(CAMPAIGN5_WARMUPS)]
    path = TRANSFER_DIR / "h200-only.yaml"
    dep = Deployment(model="qwen2.5-7b", gpu="H100-SXM", vllm_version="0.26.0", calibration=str(path))
    a, _ = errors_on(pts, [s for s in startups(rows) if s.ok], dep, source="H200",
                     calibration=load_calibration(get_gpu("H100-SXM"), str(path)))
    b = read_transfer()["h100_to_h200"]
    print("transfer error on real points no fit saw (MAPE, worst point):")
    for name, e in (("H200 -> H100 (recomputed)", a), ("H100 -> H200 (transfer.yaml)", b)):
        print(f"  {name:29s} {e.points:3d} points: tokens/s {e.tokens_per_s_mape:5.1f} % ({e.tokens_per_s_worst:.0f}),"
              f" P95 TTFT {e.ttft_p95_mape:5.1f} % ({e.ttft_p95_worst:.0f}), KV tokens {e.kv_tokens_mape:.2f} % "
              f"({e.kv_tokens_worst:.1f}) over {e.starts} starts")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=int, default=None, help="trials per kind (default: each fleet file's)")
    ap.add_argument("--keep", default=None, help="folder for the plans (default: a fresh temporary one)")
    args = ap.parse_args()
    base = Path(args.keep or tempfile.mkdtemp(prefix="fleet-bench-"))
    timing = []
    for name, demand in RUNS:
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_fleet(name, demand, slos=("p95:ttft<=5s",), tokens_per_conversation=300, budget=args.budget,
                          folder=base / name)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        print(f"\n{name}: {plan.fleet['model']}, {demand} conversations of 300 tokens, P95 TTFT <= 5 s "
              f"(+20 % headroom: {plan.need_per_min:,.0f}/min)")
        kind_rows(plan)
        if name == "article-004-room":
            room = plan.kind("V100-32GB-SXM2")
            n = room.engines_available or 0
            print(f"  the room alone: {n} engines of TP{room.tp} hold {n * room.per_min():,.0f} conversations/min "
                  f"({n * room.capacity['tokens_per_s']:,.0f} tok/s); the article's TP8 instance: 1,000-1,200 "
                  "(5,000-6,000 tok/s)")
        verdict(plan)
        steps: dict[str, float] = {}
        for k in plan.kinds:
            for s, v in k.timings.items():
                steps[s] = steps.get(s, 0.0) + v
        timing.append((name, len(plan.kinds), cpu, wall, steps))
    print()
    transfer()
    print("\ntime the plans took (CPU s; wall s on this shared machine):")
    for name, n, cpu, wall, steps in timing:
        print(f"  {name:18s} {n} kinds: {cpu:5.1f} CPU-s ({wall:5.1f} wall) = "
              + ", ".join(f"{s} {v:.1f}" for s, v in steps.items()))


if __name__ == "__main__":
    main()

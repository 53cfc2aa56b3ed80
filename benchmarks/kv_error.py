"""How far the memory planner's KV cache is from vLLM's, and how far two starts of one
configuration are from each other: the data behind ``tuner estimate``'s and
``tuner search --start-refused``'s error band for a predicted refusal, and behind the
race's headroom rule on a memory-tight card (:mod:`tuner.study.headroom`).

Every start measured on real vLLM 0.26.0 (the H200 calibration campaigns in
``tuner/data/calibration/h200-vllm-0.26.0``, campaign 4 on an H200, campaigns 5 and 6 on an
H100 in ``benchmarks/h200/``): the planner's KV blocks (predicted) against the
``num_gpu_blocks`` vLLM logged (measured), as (predicted - measured) / measured: positive where
vLLM found less KV memory than the planner said. And the pairs of starts of one
configuration (a fresh process each): how far vLLM's own KV moves from start to start.

Run: ``python benchmarks/kv_error.py [--write]``; ``--write`` stores the band per GPU in
``tuner/data/calibration/kv_error.yaml`` (read by :mod:`tuner.search.refusal`).
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import yaml

from tuner.calibrate import campaign_rows, compare_startups, read_measurements, startups
from tuner.serving.config import Deployment

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (  # (where, GPU, rows)
    ("tuner/data/calibration/h200-vllm-0.26.0", "H200", lambda p: campaign_rows(p)),
    ("benchmarks/h200/campaign5/measurements.jsonl", "H100-SXM", lambda p: read_measurements(p)),
    ("benchmarks/h200/campaign6/measurements.jsonl", "H100-SXM", lambda p: read_measurements(p)),
)
OUT = ROOT / "tuner" / "data" / "calibration" / "kv_error.yaml"
MOE = {"qwen3-30b-a3b"}


def starts() -> list[dict]:
    """One row per distinct start (campaign 4's rows are also in the calibration folder)."""
    out, seen = [], set()
    for where, gpu, read in SOURCES:
        rows = read(ROOT / where)
        points = startups(rows)
        for s, r in zip(points, compare_startups(points, Deployment(model="qwen2.5-7b", gpu=gpu, vllm_version="0.26.0"))):  # noqa: E501
            key = (gpu, r["trial"])
            if key in seen:
                continue
            seen.add(key)
            out.append({"gpu": gpu, "where": where, "config": s.config, **r})
    return out


def pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """Starts of one configuration on one GPU kind, each in a fresh process."""
    out = []
    for _, group in itertools.groupby(sorted(rows, key=lambda r: (r["gpu"], r["model"])),
                                                 key=lambda r: (r["gpu"], r["model"])):
        group = [r for r in group if r["measured_ok"] and r.get("measured_blocks")]
        for a, b in itertools.combinations(group, 2):
            if a["config"] == b["config"]:
                out.append((a, b))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"store the bands in {OUT.relative_to(ROOT)}")
    args = parser.parse_args()
    rows = starts()
    print(f"{'gpu':<9} {'start':<16} {'model':<17} {'measured':>10} {'predicted':>10} {'error':>8}")
    for r in rows:
        what = "blocks" if r.get("measured_blocks") else ("max len" if not r["measured_ok"] else "tokens")
        m = r.get("measured_blocks") or r["measured"]
        p = r.get("predicted_blocks") or r["predicted"]
        print(f"{r['gpu']:<9} {r['trial']:<16} {r['model']:<17} {m:>10,} {p:>10,} {r['error_pct']:>+7.2f}%  {what}")
    bands = {}
    for gpu in sorted({r["gpu"] for r in rows}):
        for moe in (False, True):
            errs = [r["error_pct"] for r in rows if r["gpu"] == gpu and r["measured_ok"] and r.get("measured_blocks")
                    and (r["model"] in MOE) == moe]
            if errs:
                bands.setdefault(gpu, {})["moe" if moe else "dense"] = {
                    "low_pct": round(min(errs), 2), "high_pct": round(max(errs), 2), "starts": len(errs),
                    "optimistic": sum(1 for e in errs if e > 0)}
    print("\nthe planner's KV error per GPU kind ((predicted - measured) / measured; > 0: vLLM found less):")
    for gpu, kinds in bands.items():
        for kind, b in kinds.items():
            print(f"  {gpu:<9} {kind:<6} {b['low_pct']:+.2f} % to {b['high_pct']:+.2f} % over {b['starts']} starts "
                  f"({b['optimistic']} optimistic)")
    print("\nstarts of one configuration (fresh processes): vLLM's own KV blocks, start to start")
    for a, b in pairs(rows):
        gap = 100.0 * (b["measured_blocks"] - a["measured_blocks"]) / a["measured_blocks"]
        print(f"  {a['gpu']:<9} {a['trial']:<16} {b['trial']:<16} {a['measured_blocks']:>8,} {b['measured_blocks']:>8,} "  # noqa: E501
              f"{gap:+.3f} %")
    if args.write:
        OUT.write_text("# The memory planner's KV cache against vLLM 0.26.0's, per GPU kind: (predicted - measured)\n"
                       "# / measured over every measured start (> 0: vLLM found less KV memory than predicted).\n"
                       "# Written by `python benchmarks/kv_error.py --write`; read by tuner.search.refusal.\n"
                       + yaml.safe_dump({"vllm_version": "0.26.0", "gpus": bands}, sort_keys=True))
        print(f"\nwrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

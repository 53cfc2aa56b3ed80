"""Each load probe of campaign 6 (measurements.jsonl beside this file) replayed on the simulator
(:func:`tuner.calibrate.compare_loads`: the probe's own requests, concurrency and configuration)
on the card the rows were measured on (default H100-SXM): measured against predicted tokens/s,
P95 and mean TTFT, and mean TPOT; then the probes with --api-server-count 4 against the same
probes' mean over the two starts with one API server, measured and predicted.

    python benchmarks/h200/campaign6/predict.py [GPU]
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tuner.calibrate import compare_loads, load_points, read_measurements  # noqa: E402
from tuner.serving.config import Deployment  # noqa: E402

ROWS = Path(__file__).with_name("measurements.jsonl")
KEYS = (("tokens_per_s", "tok/s", 1.0, "{:7.0f}"), ("ttft_p95_s", "P95 TTFT", 1.0, "{:6.3f}"),
        ("ttft_mean_s", "mean TTFT", 1.0, "{:6.3f}"), ("tpot_mean_s", "TPOT ms", 1e3, "{:6.2f}"))


def main() -> None:
    gpu = sys.argv[1] if len(sys.argv) > 1 else "H100-SXM"
    points = load_points(read_measurements(ROWS))
    table = compare_loads(points, Deployment(model="qwen2.5-7b", gpu=gpu, vllm_version="0.26.0"))
    by_probe: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for p, r in zip(points, table):
        print(f"{p.trial:13} {p.label:24} " + "  ".join(
            f"{what} {fmt.format(r[k + '_measured'] * x)} pred {fmt.format(r[k + '_predicted'] * x)} "
            f"({(r[k + '_predicted'] / r[k + '_measured'] - 1) * 100:+5.1f} %)" for k, what, x, fmt in KEYS))
        if not p.config.enforce_eager:
            by_probe[(p.label, p.config.api_server_count or 1)].append(r)
    print("\n--api-server-count 4 against one API server (the mean of its starts), measured and predicted:")
    for (name, servers), four in sorted(by_probe.items()):
        if servers != 4 or (name, 1) not in by_probe:
            continue
        one = by_probe[(name, 1)]
        ratio = lambda key: np.mean([r[key] for r in four]) / np.mean([r[key] for r in one])  # noqa: E731, B023 (used in this iteration)
        print(f"  {name:24} " + "  ".join(f"{what} x{ratio(k + '_measured'):.2f} (pred x{ratio(k + '_predicted'):.2f})"
                                         for k, what, _, _ in KEYS[:3]))


if __name__ == "__main__":
    main()

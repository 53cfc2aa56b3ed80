"""Each load probe of campaign 5 (measurements.jsonl beside this file) replayed on the simulator
(:func:`tuner.calibrate.compare_loads`: the probe's own requests, concurrency and configuration)
on the card the rows were measured on (default H100-SXM): measured vs predicted mean TPOT and tokens/s.

    python benchmarks/h200/campaign5/predict.py [GPU]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tuner.calibrate import compare_loads, load_points, read_measurements  # noqa: E402
from tuner.serving.config import Deployment  # noqa: E402

ROWS = Path(__file__).with_name("measurements.jsonl")


def main() -> None:
    gpu = sys.argv[1] if len(sys.argv) > 1 else "H100-SXM"
    points = load_points(read_measurements(ROWS))
    for p, r in zip(points, compare_loads(points, Deployment(model="qwen2.5-7b", gpu=gpu, vllm_version="0.26.0"))):
        meas, pred = r["tpot_mean_s_measured"], r["tpot_mean_s_predicted"]
        print(f"{p.trial:10} {p.workload['kind']:6} x{p.requests:<3} @{p.users:<3} "
              f"TPOT meas {meas * 1e3:6.2f} pred {pred * 1e3:6.2f} ms ({(pred / meas - 1) * 100:+5.1f} %)  "
              f"tok/s meas {r['tokens_per_s_measured']:7.0f} pred {r['tokens_per_s_predicted']:7.0f}")


if __name__ == "__main__":
    main()

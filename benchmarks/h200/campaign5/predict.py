"""Each load probe of campaign 5 (measurements.jsonl beside this file) replayed on the simulator
with the requests' own prompt and output lengths, the same concurrency and configuration, on the
card the rows were measured on (default H100-SXM): measured vs predicted mean TPOT and tokens/s.

    python benchmarks/h200/campaign5/predict.py [GPU]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from tuner.backends.sim import SimBackend
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency
from tuner.traffic.workload import Workload

ROWS = Path(__file__).with_name("measurements.jsonl")


def main() -> None:
    gpu = sys.argv[1] if len(sys.argv) > 1 else "H100-SXM"
    for line in ROWS.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") != "load":
            continue
        w = Workload(arrival_s=np.zeros(r["requests"]), prompt_tokens=np.array(r["prompt_tokens"]),
                     output_tokens=np.array(r["output_tokens"]))
        dep = Deployment(model=r["model"], gpu=gpu, gpu_count=1, vllm_version="0.26.0")
        with SimBackend().start(dep, ServeConfig.from_dict(r["config"])) as inst:
            s = inst.run(w, Concurrency(r["load"]["users"])).summary()
        m = r["summary"]
        print(f"{r['trial']:10} {r['workload']['kind']:6} x{r['requests']:<3} @{r['load']['users']:<3} "
              f"TPOT meas {m['tpot_mean_s'] * 1e3:6.2f} pred {s['tpot_mean_s'] * 1e3:6.2f} ms "
              f"({(s['tpot_mean_s'] / m['tpot_mean_s'] - 1) * 100:+5.1f} %)  "
              f"tok/s meas {m['tokens_per_s']:7.0f} pred {s['tokens_per_s']:7.0f}")


if __name__ == "__main__":
    main()

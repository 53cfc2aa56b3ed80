"""Each load probe of campaign 6 (measurements.jsonl beside this file) replayed on the simulator
with the requests' own prompt and output lengths, the same concurrency and configuration, on the
card the rows were measured on (default H100-SXM): measured against predicted tokens/s, P95 and
mean TTFT, and mean TPOT; then the probes with --api-server-count 4 against the same probes' mean
over the two starts with one API server, measured and predicted.

    python benchmarks/h200/campaign6/predict.py [GPU]
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tuner.backends.sim import SimBackend  # noqa: E402
from tuner.calibrate.probes import label  # noqa: E402
from tuner.serving.config import Deployment, ServeConfig  # noqa: E402
from tuner.serving.load import Concurrency  # noqa: E402
from tuner.traffic.workload import Workload  # noqa: E402

ROWS = Path(__file__).with_name("measurements.jsonl")
KEYS = (("tokens_per_s", "tok/s", 1.0, "{:7.0f}"), ("ttft_p95_s", "P95 TTFT", 1.0, "{:6.3f}"),
        ("ttft_mean_s", "mean TTFT", 1.0, "{:6.3f}"), ("tpot_mean_s", "TPOT ms", 1e3, "{:6.2f}"))


def main() -> None:
    gpu = sys.argv[1] if len(sys.argv) > 1 else "H100-SXM"
    by_probe: dict[tuple[str, int], dict[str, list[tuple[dict, dict]]]] = defaultdict(lambda: defaultdict(list))
    for line in ROWS.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") != "load" or not r.get("ok"):
            continue
        w = Workload(arrival_s=np.zeros(r["requests"]), prompt_tokens=np.array(r["prompt_tokens"]),
                     output_tokens=np.array(r["output_tokens"]))
        config = ServeConfig.from_dict(r["config"])
        dep = Deployment(model=r["model"], gpu=gpu, gpu_count=1, vllm_version="0.26.0")
        with SimBackend().start(dep, config) as inst:
            s = inst.run(w, Concurrency(r["load"]["users"])).summary()
        m = r["summary"]
        name = label(r["workload"], r["load"])
        print(f"{r['trial']:13} {name:24} " + "  ".join(
            f"{what} {fmt.format(m[k] * x)} pred {fmt.format(s[k] * x)} ({(s[k] / m[k] - 1) * 100:+5.1f} %)"
            for k, what, x, fmt in KEYS))
        if not config.enforce_eager:
            servers = "4" if config.api_server_count == 4 else "1"
            by_probe[(name, servers)]["rows"].append((m, s))
    print("\n--api-server-count 4 against one API server (the mean of its starts), measured and predicted:")
    for (name, servers), d in sorted(by_probe.items()):
        if servers != "4" or (name, "1") not in by_probe:
            continue
        one, four = by_probe[(name, "1")]["rows"], d["rows"]
        parts = []
        for k, what, _, _ in KEYS[:3]:
            meas = np.mean([m[k] for m, _ in four]) / np.mean([m[k] for m, _ in one])
            pred = np.mean([s[k] for _, s in four]) / np.mean([s[k] for _, s in one])
            parts.append(f"{what} x{meas:.2f} (pred x{pred:.2f})")
        print(f"  {name:24} " + "  ".join(parts))


if __name__ == "__main__":
    main()

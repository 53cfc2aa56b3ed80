"""Simulator fidelity against real vLLM: measured vs predicted per configuration and load.

    python benchmarks/fidelity.py [PROFILE_DIR]     (default: the shipped H200 / vLLM 0.26.0 data)

Prints, per trial and load: output-token throughput, P95 TTFT and mean TPOT as measured
on the GPU and as predicted by the simulator with the fitted profile, and the same with
the unfitted Hopper class table as the baseline (ratios predicted/measured); then KV
cache tokens per start (or the refusal's estimated max model length); then MAPE and
Spearman summaries for the fit and the held-back ("check") trials.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.calibrate import (  # noqa: E402
    METRICS,
    compare_loads,
    compare_startups,
    load_points,
    read_measurements,
    startups,
    summarize,
)
from tuner.config import Deployment  # noqa: E402
from tuner.sim.calibration import load_calibration, profile_section  # noqa: E402
from tuner.sim.hardware import get_gpu  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[1] / "tuner" / "data" / "calibration" / "h200-vllm-0.26.0"


def main(folder: Path) -> None:
    profile = folder / "profile.yaml"
    match = profile_section(profile, "match")
    fit_info = profile_section(profile, "fit")
    check = set(fit_info.get("check_trials", []))
    dep = Deployment(model="qwen2.5-7b", gpu=match["gpu"], vllm_version=match["vllm_version"],
                     calibration=str(profile))
    rows = read_measurements(folder / "measurements.jsonl")
    points = load_points(rows)
    t0 = time.perf_counter()
    ours = compare_loads(points, dep)
    t_ours = time.perf_counter() - t0
    base = compare_loads(points, dep, load_calibration(get_gpu(dep.gpu)))   # class table, unfitted
    short = {"output_tokens_per_s": "tok/s", "ttft_p95_s": "P95 TTFT s", "tpot_mean_s": "TPOT ms"}
    scale = {"output_tokens_per_s": 1.0, "ttft_p95_s": 1.0, "tpot_mean_s": 1e3}
    print(f"{match['gpu']} vLLM {match['vllm_version']}: {len(points)} load points, simulated in {t_ours:.1f} s")
    print("set   trial      users | " + " | ".join(f"{short[k]:>10} meas  pred  (ratio; table)" for k in METRICS))
    for o, b in zip(ours, base):
        cells = []
        for k in METRICS:
            m, p, pb = o[f"{k}_measured"], o[f"{k}_predicted"], b[f"{k}_predicted"]
            cells.append(f"{m * scale[k]:>9.4g} {p * scale[k]:>9.4g} ({p / m:4.2f}; {pb / m:4.2f})")
        tag = "check" if o["trial"] in check else "fit"
        print(f"{tag:5s} {o['trial']:10s} {o['users']:5d} | " + " | ".join(cells))
    print("\nKV cache tokens per start (refusals: vLLM's estimated max model length)")
    for r in compare_startups(startups(rows), dep):
        tag = "check" if r["trial"] in check else "fit"
        what = "tokens" if r["measured_ok"] else f"refused ({r.get('kind')}), est. max len"
        err = r.get("error_pct", math.nan)
        print(f"{tag:5s} {r['trial']:10s} {what:34s} measured {r['measured']:>10} predicted "
              f"{r['predicted']:>10}  error {err:+.2f}%")
    print("\nsummary (MAPE %, Spearman of throughput): fitted profile vs class table")
    for name in ("fit", "check"):
        sel = [i for i, o in enumerate(ours) if (o["trial"] in check) == (name == "check")]
        if not sel:
            continue
        so, sb = summarize([ours[i] for i in sel]), summarize([base[i] for i in sel])
        print(f"{name:5s} " + "  ".join(f"{k}: {so[k]:.3g} vs {sb[k]:.3g}" for k in so))
    so = summarize(ours)
    print(f"all   throughput Spearman at saturation over {len({o['trial'] for o in ours})} configs: "
          f"{so['throughput_spearman_saturation']:.2f}")
    import yaml

    doc = yaml.safe_load(profile.read_text())
    table = load_calibration(get_gpu(dep.gpu))
    print("\nfitted constants: value, 95 % interval, what determined it, class table value")
    for name in ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "per_seq_overhead_s", "request_latency_s"):
        e = doc[name]
        if "ci95" in e:
            print(f"  {name:20s} {e['value']:<10.4g} [{e['ci95'][0]:.4g}, {e['ci95'][1]:.4g}]  {e['determined']:5s}"
                  f"  table {getattr(table, name):.4g}")
    for c in fit_info.get("correlated", []):
        print(f"  correlated: {c}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else SHIPPED)

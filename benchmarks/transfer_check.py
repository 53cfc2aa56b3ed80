"""The transfer check (issue 51): a profile fitted on one GPU's real points, predicting the other
GPU's real points that no fit saw, per figure (tokens/s, P95 TTFT, KV tokens).

    python benchmarks/transfer_check.py [--write] [--max-nfev N]

* H200 -> H100: the shipped H200 profile as fitted on H200 points only (its two MoE constants,
  set later from campaign 5's H100 points, reverted: :func:`tuner.calibrate.transfer.h200_only`)
  predicts the H100 points of campaigns 5 and 6 (``benchmarks/h200/campaign5``, ``campaign6``;
  campaign 5's warm-up probes are not data) and their starts' KV cache sizes.
* H100 -> H200: ``tuner calibrate``'s fit on those H100 points only (one start from the Hopper
  class table, whose priors stay where the H100 data do not reach) predicts every H200 point of
  ``tuner/data/calibration/h200-vllm-0.26.0`` (campaigns 1-4, less its excluded points) and starts.
* For the H100 kind as planned today: the Hopper class table (what an H100 runs on; no H100
  profile ships) on the H100 points it was never fitted on (all but campaign 5's MoE decode ladder,
  which set its two MoE constants).

``--write`` writes ``tuner/data/calibration/transfer/`` (``h200-only.yaml``, ``h100-only.yaml``,
``transfer.yaml``), which the fleet plan reads for the bands of GPU classes never measured.
The H200 points with trace workloads re-read ``../shared/traces``.
"""
from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from tuner.calibrate import campaign_rows, load_points, point_name, read_measurements, startups, write_profile  # noqa: E402
from tuner.calibrate.transfer import (  # noqa: E402
    CAMPAIGN5_WARMUPS,
    TRANSFER_DIR,
    TRANSFER_FILE,
    errors_on,
    fit_on,
    h200_only,
)
from tuner.runtime.progress import Observer  # noqa: E402
from tuner.serving.config import Deployment  # noqa: E402
from tuner.sim.calibration import load_calibration  # noqa: E402
from tuner.sim.hardware import get_gpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
H200_DIR = ROOT / "tuner" / "data" / "calibration" / "h200-vllm-0.26.0"
H100_DIRS = (ROOT / "benchmarks" / "h200" / "campaign5", ROOT / "benchmarks" / "h200" / "campaign6")
MOE_LADDER = {f"{t}: decode x{n} @ {u} users" for t in ("moe-small", "moe-small-again")
              for n, u in ((3, 1), (4, 2), (8, 4), (16, 8), (32, 16), (64, 32))}


class Printer(Observer):
    def __init__(self) -> None:
        self.t0 = time.process_time()

    def on_phase(self, text: str) -> None:
        print(f"  [{time.process_time() - self.t0:6.0f} CPU-s] {text}", flush=True)


def h100_rows() -> list[dict]:
    rows: list[dict] = []
    for d in H100_DIRS:
        rows += read_measurements(d / "measurements.jsonl")
    return rows


def h200_rows() -> tuple[list[dict], set[str]]:
    profile = yaml.safe_load((H200_DIR / "profile.yaml").read_text())
    return campaign_rows(H200_DIR), set(profile["fit"].get("excluded") or [])


def show(name: str, err) -> None:
    print(f"{name:22s} {err.points:3d} points {err.starts:2d} starts | tokens/s MAPE {err.tokens_per_s_mape:5.1f} % "
          f"(worst {err.tokens_per_s_worst:5.1f}) | P95 TTFT {err.ttft_p95_mape:5.1f} % (worst {err.ttft_p95_worst:5.1f})"  # noqa: E501
          f" | KV tokens {err.kv_tokens_mape:5.2f} % (worst {err.kv_tokens_worst:5.2f})")


def main(argv: list[str]) -> None:
    nfev = int(argv[argv.index("--max-nfev") + 1]) if "--max-nfev" in argv else None
    out = TRANSFER_DIR if "--write" in argv else Path("/tmp/tuner-transfer-check")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.process_time()
    rows100 = h100_rows()
    warm = set(CAMPAIGN5_WARMUPS)
    pts100 = [p for p in load_points(rows100) if point_name(p) not in warm]
    st100 = [s for s in startups(rows100) if s.ok]
    rows200, excluded200 = h200_rows()
    pts200 = [p for p in load_points(rows200) if point_name(p) not in excluded200]
    st200 = [s for s in startups(rows200) if s.ok]
    print(f"H100 points {len(pts100)} (starts {len(st100)}), H200 points {len(pts200)} (starts {len(st200)})")

    only200 = h200_only(H200_DIR / "profile.yaml", out / "h200-only.yaml")
    dep100 = Deployment(model="qwen2.5-7b", gpu="H100-SXM", vllm_version="0.26.0", calibration=str(only200))
    a, table_a = errors_on(pts100, st100, dep100, source="H200 (h200-only.yaml)",
                           calibration=load_calibration(get_gpu("H100-SXM"), str(only200)))
    show("H200 -> H100", a)

    print("fitting on the H100 points only (tuner calibrate's fit) ...", flush=True)
    res = fit_on(rows100, Deployment(model="qwen2.5-7b", gpu="H100-SXM", vllm_version="0.26.0"),
                 exclude=sorted(warm), max_nfev=nfev, observer=Printer())
    only100 = write_profile(res, out / "h100-only.yaml", gpu="H100-SXM", vllm_version="0.26.0",
                            meta={"note": "fitted by benchmarks/transfer_check.py on campaigns 5 and 6 (an H100) "
                                          "for the transfer check only: not a profile the simulator finds"})
    dep200 = Deployment(model="qwen2.5-7b", gpu="H200", vllm_version="0.26.0", calibration=str(only100))
    b, table_b = errors_on(pts200, st200, dep200, source="H100 (h100-only.yaml)",
                           calibration=load_calibration(get_gpu("H200"), str(only100)))
    show("H100 -> H200", b)
    fitted_in = res.errors.get("fit", {})
    print(f"  (in-sample on the H100 points: tokens/s-out MAPE {fitted_in.get('output_tokens_per_s_mape', float('nan')):.1f} %,"  # noqa: E501
          f" P95 TTFT {fitted_in.get('ttft_p95_s_mape', float('nan')):.1f} %)")

    never = [p for p in pts100 if point_name(p) not in MOE_LADDER]
    c, _ = errors_on(never, st100, Deployment(model="qwen2.5-7b", gpu="H100-SXM", vllm_version="0.26.0"),
                     source="Hopper class table (hopper.yaml)")
    show("hopper table on H100", c)
    cpu = time.process_time() - t0
    print(f"CPU time {cpu:.0f} s")
    doc = {
        "about": "Written by python benchmarks/transfer_check.py --write (issue 51): a profile fitted on one card's "
                 "real points predicting the other card's real points that no fit saw. MAPE and worst point in "
                 "percent; tokens/s is prompt + output; KV tokens over the starts that logged a KV cache size. "
                 "The fleet plan's band for a GPU class never measured is at least the larger direction.",
        "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_s": round(cpu, 1),
        "directions": {"h200_to_h100": a.to_dict(), "h100_to_h200": b.to_dict(), "hopper_table_on_h100": c.to_dict()},
        "profiles": {"h200_to_h100": "h200-only.yaml", "h100_to_h200": "h100-only.yaml"},
        "h100_fit": {"constants": {k: v["value"] for k, v in res.info["step_time"]["estimates"].items()},
                     "in_sample": {k: round(v, 3) for k, v in fitted_in.items()}},
    }
    (out / TRANSFER_FILE.name).write_text(yaml.safe_dump(doc, sort_keys=False, width=110))
    print(f"wrote {out / TRANSFER_FILE.name}")
    if "--table" in argv:
        for name, table in (("H200 -> H100", table_a), ("H100 -> H200", table_b)):
            print(name)
            for r in table:
                print(f"  {r['name'][:48]:48s} tok/s {r['tokens_per_s_predicted'] / r['tokens_per_s_measured']:5.2f}x"
                      f"  P95 TTFT {r['ttft_p95_s_predicted'] / r['ttft_p95_s_measured']:5.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])

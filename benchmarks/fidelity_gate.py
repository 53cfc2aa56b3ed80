"""Each shape group's raw error against real vLLM, the committed gate table, leave-one-shape-out.

    python benchmarks/fidelity_gate.py [--write] [--loso [--max-nfev N]] [PROFILE_DIR]

Without flags: the groups' raw errors with the shipped profile beside the committed table
(``fidelity_gate.csv`` in the profile folder), and any group worse than its noise.
``--loso`` refits the profile without each group the fit saw (minutes per group; from the
shipped constants, capped at ``--max-nfev`` evaluations) and prints its error then;
``--write`` writes the table (with the leave-one-out columns when ``--loso`` ran, else those
of the committed table).
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from tuner.calibrate import (  # noqa: E402
    campaign_rows,
    compare_loads,
    load_points,
    measurement_noise,
    point_name,
    read_measurements,
    replicate_pairs,
)
from tuner.calibrate.fidelity import mape  # noqa: E402
from tuner.calibrate.gate import TABLE, group_errors, leave_one_out, noise_pairs, read_table, regressions, write_table  # noqa: E402
from tuner.serving.config import Deployment  # noqa: E402
from tuner.sim.calibration import load_calibration  # noqa: E402
from tuner.sim.hardware import get_gpu  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[1] / "tuner" / "data" / "calibration" / "h200-vllm-0.26.0"


def f(v: float) -> str:
    return "    -" if math.isnan(v) else f"{v:5.1f}"


def main(argv: list[str]) -> None:
    args = [a for a in argv if not a.startswith("--")]
    nfev = int(argv[argv.index("--max-nfev") + 1]) if "--max-nfev" in argv else None
    if nfev is not None:
        args.remove(str(nfev))
    folder = Path(args[0]) if args else SHIPPED
    profile = yaml.safe_load((folder / "profile.yaml").read_text())
    dep = Deployment(model="qwen2.5-7b", gpu=profile["match"]["gpu"], vllm_version=profile["match"]["vllm_version"],
                     calibration=str(folder / "profile.yaml"))
    rows = campaign_rows(folder)
    excluded = set(profile["fit"].get("excluded") or [])
    points = [p for p in load_points(rows) if point_name(p) not in excluded]
    table = compare_loads(points, dep)
    pairs = noise_pairs(folder, rows, sorted(excluded))
    groups = group_errors(points, table, pairs, set(profile["fit"]["fit_points"]))
    committed = {g.group: g for g in read_table(folder / TABLE)} if (folder / TABLE).is_file() else {}
    if "--loso" in argv:
        noise = measurement_noise(rows, read_measurements(folder / "replicate.jsonl"), pairs=replicate_pairs(rows, excluded))  # noqa: E501
        start = load_calibration(get_gpu(dep.gpu), str(folder / "profile.yaml"))
        t0 = time.process_time()
        groups = leave_one_out(rows, points, Deployment(model="qwen2.5-7b", gpu=dep.gpu, vllm_version=dep.vllm_version),
                               profile, groups, start=start, noise=noise, max_nfev=nfev,
                               log=lambda m: print(f"  [{time.process_time() - t0:5.0f} CPU-s] {m}", flush=True))
    else:
        # the committed leave-one-out columns; a group the fit never saw is held back already
        groups = [replace(g, tokens_per_s_loso=committed[g.group].tokens_per_s_loso,
                          ttft_p95_loso=committed[g.group].ttft_p95_loso) if g.group in committed
                  else replace(g, tokens_per_s_loso=g.tokens_per_s_mape, ttft_p95_loso=g.ttft_p95_mape)
                  if not g.fitted else g for g in groups]
    print(f"{len(points)} real load points in {len(groups)} shape groups; MAPE %, raw predictions of the shipped "
          "profile (in-sample: fitted on the points marked; leave-one-shape-out: refit without the whole group)")
    print(f"{'group':58s} {'n':>2s} {'fit':>3s} | {'tok/s':>5s} {'LOSO':>5s} {'noise':>5s} | "
          f"{'P95 TTFT':>8s} {'LOSO':>5s} {'noise':>5s}")
    for g in groups:
        print(f"{g.group[:58]:58s} {g.points:2d} {g.fitted:3d} | {f(g.tokens_per_s_mape)} {f(g.tokens_per_s_loso)} "
              f"{f(g.tokens_per_s_noise)} | {f(g.ttft_p95_mape):>8s} {f(g.ttft_p95_loso)} {f(g.ttft_p95_noise)}")
    n = sum(g.points for g in groups)
    w = lambda key: sum(getattr(g, key) * g.points for g in groups if not math.isnan(getattr(g, key))) / n  # noqa: E731
    print(f"{'all points (mean over points)':58s} {n:2d}     | {f(mape(table, 'tokens_per_s'))} "
          f"{f(w('tokens_per_s_loso'))}       | {f(mape(table, 'ttft_p95_s')):>8s} {f(w('ttft_p95_loso'))}")
    for key, what in (("tokens_per_s_loso", "tokens/s"), ("ttft_p95_loso", "P95 TTFT")):
        done = [g for g in groups if not math.isnan(getattr(g, key))]
        if done:
            g = max(done, key=lambda g: getattr(g, key))
            print(f"worst group, leave-one-shape-out {what}: {getattr(g, key):.1f} % ({g.group})")
    if committed:
        bad = regressions(groups, list(committed.values()))
        print("gate: " + ("no group worse than its noise" if not bad else "\n  ".join(["FAILS"] + bad)))
    if "--write" in argv:
        write_table(folder / TABLE, groups)
        print(f"wrote {folder / TABLE}")


if __name__ == "__main__":
    main(sys.argv[1:])

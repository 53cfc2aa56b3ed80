"""What deciding blame by experiment costs on a noisy machine (tuner.search.blame).

    python benchmarks/blame_cost.py [--studies 6] [--rate 0.3]

Each study is a grid of 8 configurations with a confirmation race (``--confirm 3``) on
``tuner sim-serve`` behind tests/faults/faulty.py, which crashes a start after the
engine began loading at random with probability ``--rate`` (seeded per study: a
machine's transient fault, the same for every configuration). Per study: the starts the
servers saw and how many crashed, the extra starts the judging added (a failed
configuration started again, control runs) and their GPU seconds against the study's,
and whether any crash was stored as a configuration's result (it must not be). A study
with ``--rate 0`` first gives the cost of the same study on a sound machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPACE = """\
name: blamecost
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 1}
workload: {target_ttft_s: 2s, requests: 24}
parameters:
  max_num_seqs: {choices: [16, 32, 64, 128]}
  max_model_len: 4096
  enforce_eager: {choices: [false, true]}
layouts: [tp1x1]
"""
NOTE = re.compile(r"took (\d+) extra starts?, ([\d,.]+) s of GPU time.*?: (\d+) control runs? .*?, ([\d,.]+) s")


def study(folder: Path, rate: float, seed: int) -> dict:
    folder.mkdir(parents=True)
    (folder / "space.yaml").write_text(SPACE)
    state = folder / "faulty"
    cmd = (f"{sys.executable} {ROOT / 'tests' / 'faults' / 'faulty.py'} --fault transient --rate {rate} "
           f"--seed {seed} --state {state} sim-serve --speed 50")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tuner", "search", "--space", "space.yaml", "--backend", "vllm",
                           "--vllm-cmd", cmd, "--sampler", "grid", "--budget", "8", "--no-predict", "--confirm", "3",
                           "--output", "json"], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.monotonic() - t0
    report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    notes = " ".join(report.get("notes") or [])
    m = NOTE.search(notes)
    starts = (state / "starts").read_text().split("\n") if (state / "starts").exists() else []
    starts = [s for s in starts if s]
    blamed = _blamed(folder)
    return {"seed": seed, "exit": done.returncode, "starts": len(starts),
            "crashed": sum(s.startswith("crash") for s in starts), "extra_starts": int(m.group(1)) if m else 0,
            "judging_gpu_s": float(m.group(2).replace(",", "")) if m else 0.0, "gpu_s": report.get("gpu_s") or 0.0,
            "controls": int(m.group(3)) if m else 0, "control_gpu_s": float(m.group(4).replace(",", "")) if m else 0.0,
            "blamed": blamed, "wall_s": wall, "stderr": done.stderr.strip().splitlines()[-1:] if done.returncode else []}  # noqa: E501


def _blamed(folder: Path) -> int:
    """Trials (and confirmation repeats) stored as a configuration's result for a crash: an
    infeasible trial with the crash's line, or a repeat failed as the configuration's ``crash``."""
    import sqlite3

    n = 0
    for db in (folder / "studies").glob("*.db"):
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT trial_id, key, value_json FROM trial_user_attributes WHERE key IN "
                                "('infeasible_reason', 'fail_reason', 'fail_kind')").fetchall()
        attrs: dict[int, dict[str, str]] = {}
        for trial, key, value in rows:
            attrs.setdefault(trial, {})[key] = value
        n += sum(1 for a in attrs.values() if "NCCL error" in a.get("infeasible_reason", "")
                 or ("NCCL error" in a.get("fail_reason", "") and a.get("fail_kind") == '"crash"'))
    return n


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", type=int, default=6)
    p.add_argument("--rate", type=float, default=0.3)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tuner-blame-") as tmp:
        sound = study(Path(tmp) / "sound", 0.0, 0)
        for seed in range(1, args.studies + 1):
            rows.append(study(Path(tmp) / f"s{seed}", args.rate, seed))
            print(f"  seed {seed}: {rows[-1]['starts']} starts, {rows[-1]['extra_starts']} extra", file=sys.stderr)
    head = ("study", "exit", "starts", "crashed", "extra starts", "of them controls", "judging GPU s",
            "controls' GPU s", "study GPU s", "judging share", "controls' share", "crashes stored", "wall s")

    def line(r: dict, name: str) -> tuple:
        share = r["judging_gpu_s"] / r["gpu_s"] if r["gpu_s"] else 0.0
        cshare = r["control_gpu_s"] / r["gpu_s"] if r["gpu_s"] else 0.0
        return (name, r["exit"], r["starts"], r["crashed"], r["extra_starts"], r["controls"],
                f"{r['judging_gpu_s']:.1f}", f"{r['control_gpu_s']:.1f}", f"{r['gpu_s']:.1f}", f"{share:.1%}",
                f"{cshare:.1%}", r["blamed"], f"{r['wall_s']:.0f}")

    table = [line(sound, "sound machine")] + [line(r, f"rate {args.rate:.0%}, seed {r['seed']}") for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *table]) for i in range(len(head))]
    for r in [head, *table]:
        print(" | ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)))
    mean = lambda key: statistics.fmean(r[key] for r in rows)  # noqa: E731
    share = statistics.fmean(r["judging_gpu_s"] / r["gpu_s"] for r in rows if r["gpu_s"])
    cshare = statistics.fmean(r["control_gpu_s"] / r["gpu_s"] for r in rows if r["gpu_s"])
    print(f"\nper study at {args.rate:.0%} crashes: {mean('extra_starts'):.1f} extra starts "
          f"({mean('controls'):.1f} of them control runs), {mean('judging_gpu_s'):.1f} s of GPU time ({share:.1%} of "
          f"the study's; the controls {mean('control_gpu_s'):.1f} s, {cshare:.1%}); the same study on a sound machine: "
          f"{sound['gpu_s']:.1f} s, {sound['extra_starts']} extra; crashes stored as a configuration's: "
          f"{sum(r['blamed'] for r in rows)}; exits {sorted({r['exit'] for r in rows})}")
    return 0 if all(r["exit"] == 0 and not r["blamed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

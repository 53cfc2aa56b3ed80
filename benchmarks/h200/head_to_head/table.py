"""The head-to-head table (README.md beside this file) from the studies the device calls wrote:

    python benchmarks/h200/head_to_head/table.py [--db results/res/h2h.db] [--gpu H100-SXM|H200]

One row a strategy: its pick (the flags it sets), tokens/s at the P95 TTFT edge on three fresh starts (mean and
range: the trial and the confirmation race's repeats, tuner's replayer), the ratio to vLLM's defaults, the
GPU-seconds it spent (tuner's accounting: starts, measured loads, thrown away) and its wall time. A strategy not
measured yet says so.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STRATEGIES = (("a", "defaults", "vLLM's defaults"), ("b", "article", "article 000's flags"),
              ("c", "autotune", "auto_tune.sh's pick"), ("d", "tuner", "tuner search"))
KNOB_FLAGS = {"gpu_memory_utilization": "gmu", "max_num_seqs": "seqs", "max_model_len": "len",
              "block_size": "block", "max_num_batched_tokens": "mbt", "kv_cache_dtype": "kv"}


def show(study: str, db: Path) -> dict | None:
    """`tuner studies show STUDY -o json`, or None where the study is not in the file."""
    done = subprocess.run([sys.executable, "-m", "tuner", "studies", "show", study, "--storage", f"sqlite:///{db}",
                           "-o", "json"], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None


def pick(config: dict) -> str:
    """The knobs the pick sets, short: what differs from vLLM's defaults."""
    parts = [f"{short}={config[k]}" for k, short in KNOB_FLAGS.items()
             if config.get(k) not in (None, "auto")]
    if config.get("enable_prefix_caching") is False:
        parts.append("no-prefix-cache")
    if config.get("enforce_eager"):
        parts.append("eager")
    return " ".join(parts) or "(nothing set)"


def wall_s(study: str, db: Path) -> float | None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stamps = []
    for name in (study, f"{study}.confirm"):
        try:
            trials = optuna.load_study(study_name=name, storage=f"sqlite:///{db}").trials
        except KeyError:
            continue
        stamps += [(t.datetime_start, t.datetime_complete) for t in trials if t.datetime_start and t.datetime_complete]
    if not stamps:
        return None
    return (max(end for _, end in stamps) - min(start for start, _ in stamps)).total_seconds()


def row(letter: str, study: str, label: str, db: Path, base: float | None) -> tuple[list[str], float | None]:
    info = show(study, db) if db.exists() else None
    if not info or not info.get("best"):
        return [letter, label, "not measured yet", "", "", "", ""], None
    conf = info.get("confirmation") or {}
    mean = conf.get("mean_tokens_per_s") or info["best"]["tokens_per_s"]
    lo, hi = conf.get("band_tokens_per_s") or (mean, mean)
    n = conf.get("measurements") or 1
    g = info["gpu_time"]
    wall = wall_s(study, db)
    return [letter, label, pick(info["best"]["config"]), f"{mean:,.0f} ({lo:,.0f}-{hi:,.0f}, n={n})",
            f"x{mean / base:.3f}" if base else "-",
            f"{g['total_s']:,.0f} (starts {g['start_s']:,.0f}, loads {g['replay_s']:,.0f}, thrown {g['wasted_s']:,.0f})",  # noqa: E501
            f"{wall:,.0f}" if wall else "-"], mean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, default=HERE / "results" / "res" / "h2h.db")
    parser.add_argument("--gpu", default="H100-SXM", help="the card the studies ran on (run.sh names them h2h-GPU-...)")
    args = parser.parse_args()
    db = args.db
    print(f"{args.gpu}, vLLM 0.26.0, Qwen2.5-14B (dummy weights), azure-conv-1800-1830.jsonl, P95 TTFT <= 1 s")
    rows, base = [], None
    for letter, strategy, label in STRATEGIES:
        cells, mean = row(letter, f"h2h-{args.gpu}-{strategy}", label, db, base)
        if strategy == "defaults":
            base = mean
            cells[4] = "x1.000" if mean else ""
        rows.append(cells)
    head = ["", "strategy", "pick", "tokens/s at P95 TTFT <= 1 s", "vs defaults", "GPU-s spent", "wall s"]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CLI's start-up: how long `tuner --version` and `tuner search --help` take to print, and how many
modules (tuner's own and all) Python imports for them, for this checkout beside another commit.

    python benchmarks/cli_startup.py                  # this checkout against main's first commit of issue 50
    python benchmarks/cli_startup.py --against REF    # any commit (a temporary git worktree of it)

Each command runs --runs times (fresh interpreter each time); the median wall time is printed with the ratio
to the other commit (below 1: this checkout starts faster). tuner's own imports sit at the top of their modules
(tests/test_architecture.py counts the few that do not); ``tuner CMD`` still imports CMD's command module alone
(tuner/cli/commands.py) and ``tuner --version`` none: this is what that costs.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: main before issue 50's refactoring (the figure "before")
BEFORE = "2bfe4a2"
COMMANDS = (("--version",), ("search", "--help"), ("plan", "--help"))


def timed(root: Path, args: tuple[str, ...], runs: int) -> tuple[float, int, int]:
    """Median seconds of ``python -m tuner ARGS`` from ``root``, and the modules imported (tuner's, all)."""
    env = {"PYTHONPATH": str(root), "COLUMNS": "80", "PATH": "/usr/bin:/bin"}
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tuner", *args], cwd=root, env=env, capture_output=True, check=True)
        walls.append(time.perf_counter() - t0)
    probe = ("import runpy, sys; sys.argv = ['tuner', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('tuner', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "mods = list(sys.modules); print(sum(m.split('.')[0] == 'tuner' for m in mods), len(mods), file=sys.stderr)")  # noqa: E501
    done = subprocess.run([sys.executable, "-c", probe, *args], cwd=root, env=env, capture_output=True, text=True)
    ours, every = (int(x) for x in done.stderr.strip().splitlines()[-1].split())
    return statistics.median(walls), ours, every


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default=BEFORE, help=f"the commit to compare with (default {BEFORE})")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as tmp:
        other = Path(tmp) / "other"
        subprocess.run(["git", "worktree", "add", "--detach", str(other), args.against], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            print(f"{'command':<22} {'this s':>7} {args.against + ' s':>12} {'ratio':>6}  modules (tuner/all) this | other")  # noqa: E501
            for cmd in COMMANDS:
                now, now_ours, now_all = timed(ROOT, cmd, args.runs)
                then, then_ours, then_all = timed(other, cmd, args.runs)
                print(f"tuner {' '.join(cmd):<16} {now:7.3f} {then:12.3f} {now / then:6.2f}  "
                      f"{now_ours}/{now_all} | {then_ours}/{then_all}")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

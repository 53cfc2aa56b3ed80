"""The faults an unattended tuner search meets, staged with real processes, as one table.

    python benchmarks/faults.py [SCENARIO ...]      (default: all of tests/faults/scenarios.py)

Each row: the fault, what tuner did, the study's finished trials before the fault and
after the run (and its rerun, where one belongs), tuner-marked processes left running
(must be 0) and the verdict. The same scenarios are asserted one by one in tests/faults/.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "faults"))

import scenarios  # noqa: E402


def main(names: list[str]) -> int:
    chosen = [(n, f) for n, f in scenarios.ALL if not names or n in names]
    rows = []
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tuner-faults-") as tmp:
        for name, run in chosen:
            t0 = time.monotonic()
            outcome = run(Path(tmp) / name)
            took = time.monotonic() - t0
            if outcome is None:
                rows.append((name, "not run here (needs a tmpfs mount)", "-", "-", "skipped", f"{took:.0f} s"))
            else:
                rows.append((*outcome.row(), f"{took:.0f} s"))
            print(f"  {name}: {rows[-1][-2]} ({took:.0f} s)", file=sys.stderr, flush=True)
    head = ("fault", "what happened", "finished trials before -> after", "processes left", "verdict", "took")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    widths[1] = min(widths[1], 110)
    line = lambda r: " | ".join(str(c)[:widths[i]].ljust(widths[i]) for i, c in enumerate(r))  # noqa: E731
    print(line(head))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    bad = [r for r in rows if r[4] == "FAILED"]
    left = sum(int(r[3]) for r in rows if r[3].isdigit())
    print(f"\n{len(rows) - len(bad)}/{len(rows)} survived, {left} processes left, in {time.monotonic() - t_all:.0f} s")
    return 1 if bad or left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

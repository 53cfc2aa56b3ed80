"""The faults an unattended tuner search meets, staged with real processes, as one table.

    python benchmarks/faults.py [SCENARIO ...]      (default: all of tests/faults/scenarios.py)

The table after issue 48 (52 scenarios, about 20 minutes on two busy cores; root lets the
tmpfs and PostgreSQL rows run):

    python benchmarks/faults.py

and issue 48's rows alone (launchers, disrupted replays, blame by experiment, studies that
must not vanish, nightly, credentials, inputs):

    python benchmarks/faults.py launcher_timeout launcher_daemon paused terminated warming_up \
        knob_failure hexid_failure transient study_deleted broken_nightly_study efbig quiet_night \
        password_everywhere bad_seed huge_trace impossible_request endpoint_command

Each row: the fault, what tuner did, the study's finished trials before the fault and
after the run (and its rerun, where one belongs), tuner-marked processes left running,
Python tracebacks printed and trials stored infeasible for a fault of the environment
(all three must be 0) and the verdict. The same scenarios are asserted one by one in tests/faults/.
"""
from __future__ import annotations

import json
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "faults"))

import scenarios  # noqa: E402

#: An environment fault's words, as tuner writes them (tuner/backends/vllm_args.py, tuner/search/blame.py):
#: a trial stored infeasible with one of them would be the machine's fault learnt as a configuration's.
ENV_WORDS = re.compile(r"before vLLM's engine started|which tuner did not send|not a server of this run|"
                       r"no configuration of this study has started|a configuration that differs failed|"
                       r"reduce GPU memory used by other processes|unrecognized arguments|No space left|"
                       r"Address already in use|should be provided as the first positional argument|"
                       r"stalled at once|which tuner did not ask|stopped answering|failed too|"
                       r"none has worked yet|no configuration has worked|NCCL error|file size limit")


def stored_env_faults(folder: Path) -> int:
    """Trials of the scenario's studies stored infeasible for a fault of the environment."""
    n = 0
    for db in folder.rglob("*.db"):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                rows = conn.execute("SELECT value_json FROM trial_user_attributes WHERE key = 'infeasible_reason'")
                n += sum(1 for (value,) in rows if ENV_WORDS.search(str(json.loads(value) or "")))
        except sqlite3.DatabaseError:
            continue
    return n


def tracebacks(outcome) -> int:
    """Python tracebacks in what the scenario's tuner runs printed."""
    return sum(str(v).count("Traceback (most recent call last)") for v in outcome.details.values())


def main(argv: list[str]) -> int:
    import argparse

    known = [n for n, _ in scenarios.ALL]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="scenarios: " + ", ".join(known))
    parser.add_argument("names", nargs="*", metavar="SCENARIO", help="scenarios to run (default: all)")
    names = parser.parse_args(argv).names
    if unknown := [n for n in names if n not in known]:
        parser.error(f"no scenario named {', '.join(unknown)} (see --help for the list)")
    chosen = [(n, f) for n, f in scenarios.ALL if not names or n in names]
    rows = []
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tuner-faults-") as tmp:
        for name, run in chosen:
            t0 = time.monotonic()
            outcome = run(Path(tmp) / name)
            took = time.monotonic() - t0
            if outcome is None:
                rows.append((name, "not run here (needs root: a tmpfs mount or a PostgreSQL server)", "-", "-", "-", "-",  # noqa: E501
                             "skipped", f"{took:.0f} s"))
            else:
                fault, happened, trials, left, verdict = outcome.row()
                env, tb = stored_env_faults(Path(tmp) / name), tracebacks(outcome)
                if env or tb:
                    verdict = "FAILED"
                rows.append((fault, happened, trials, left, str(tb), str(env), verdict, f"{took:.0f} s"))
            print(f"  {name}: {rows[-1][-2]} ({took:.0f} s)", file=sys.stderr, flush=True)
    head = ("fault", "what happened", "finished trials before -> after", "processes left", "tracebacks",
            "env faults stored", "verdict", "took")
    rows = [tuple(" ".join(str(c).split()) for c in r) for r in rows]  # one line a row, whatever a message holds
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    widths[1] = min(widths[1], 110)
    line = lambda r: " | ".join(str(c)[:widths[i]].ljust(widths[i]) for i, c in enumerate(r))  # noqa: E731
    print(line(head))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    bad = [r for r in rows if r[6] == "FAILED"]
    left = sum(int(r[3]) for r in rows if r[3].isdigit())
    tb = sum(int(r[4]) for r in rows if r[4].isdigit())
    env = sum(int(r[5]) for r in rows if r[5].isdigit())
    print(f"\n{len(rows) - len(bad)}/{len(rows)} survived, {left} processes left, {tb} tracebacks, {env} environment "
          f"faults stored as a configuration's, in {time.monotonic() - t_all:.0f} s")
    return 1 if bad or left or tb or env else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

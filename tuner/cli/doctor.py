"""``tuner doctor``: tuner's processes, GPU holders, stale trials and study health on this host."""
from __future__ import annotations

import datetime as dt
import json
import sys

import typer

from tuner.cli.app import app
from tuner.cli.options import OUTPUT_HELP, Output, storage_option
from tuner.cli.output import console, fit, table
from tuner.core.urls import redact
from tuner.ops.doctor import diagnose, stop_stale


@app.command("doctor", short_help="Show what tuner left running and whether studies are sound.")
def doctor_cmd(
    storage: str | None = storage_option(help="Also check this Optuna storage URL (postgresql://...). "
                                              "studies/*.db are always checked."),
    kill_stale: bool = typer.Option(False, "--kill-stale", help="Stop the servers a dead tuner run left behind (only processes carrying tuner's marker)."),  # noqa: E501
    output: Output = typer.Option(Output.text, "--output", "-o", help=OUTPUT_HELP),
) -> None:
    """Show what tuner left running on this host and whether its studies are sound.

    Lists the servers tuner started (marked with TUNER_SERVER; stale when the tuner process that started them is gone), the tuner runs in progress, what holds GPU memory (nvidia-smi), and per study file: SQLite integrity, trials left RUNNING by a dead run (the next tuner search fails them as interrupted and measures them again), leftover lock files and free disk space.

    Exit codes: 0 nothing wrong, 1 problems found (listed), 2 bad input.

    \b
    Examples:
      tuner doctor
      tuner doctor --kill-stale
    """  # noqa: E501

    d = diagnose(storage=storage)
    stopped = stop_stale(d) if kill_stale else []
    if stopped:
        d = diagnose(storage=storage)
    if output is Output.json:
        print(json.dumps({**d.to_dict(), "stopped_groups": stopped}, indent=2, default=str))
    else:
        out = console()
        servers = table("tuner's servers on this host")
        for col in ("pid", "group", "owner", "state", "started", "command"):
            servers.add_column(col)
        for s in d.servers:
            started = dt.datetime.fromtimestamp(s["started"]).strftime("%H:%M:%S")
            servers.add_row(str(s["pid"]), str(s["pgid"]), str(s["owner_pid"]),
                            "STALE" if s["stale"] else "running", started, s["cmdline"][:70])
        out.print(fit(servers, out, labels=(5,)) if d.servers else "tuner's servers on this host: none")
        out.print("tuner runs: " + ("none" if not d.runs else
                                        "; ".join(f"pid {r['pid']} {r['cmdline'][:60]}" for r in d.runs)))
        if d.gpu_holders:
            gpus = table("GPU memory holders (nvidia-smi)")
            for col in ("pid", "process", "MiB", "tuner's"):
                gpus.add_column(col)
            for g in d.gpu_holders:
                gpus.add_row(str(g["pid"]), g["process"], f"{g['used_mib'] or 0:,.0f}", "yes" if g["tuner"] else "no")
            out.print(fit(gpus, out, labels=(1,)))
        studies = table("studies")
        for col in ("file", "integrity", "stale trials", "locks", "free"):
            studies.add_column(col)
        for st in d.studies:
            free = "-" if st.free_bytes is None else f"{st.free_bytes / 2**30:.1f} GiB"
            studies.add_row(redact(st.path), st.integrity[:30], ", ".join(st.stale_trials) or "-",
                            ", ".join(st.lock_files) or "-", free)
        out.print(fit(studies, out, labels=(0, 2, 3)) if d.studies else "studies: none found")
        for note in d.notes:
            out.print(f"note: {note}", markup=False)
        for pgid in stopped:
            out.print(f"stopped stale server group {pgid}")
        for problem in d.problems:
            print(f"tuner: problem: {problem}", file=sys.stderr)
        if d.problems and not kill_stale and any(s["stale"] for s in d.servers):
            print("tuner: stop stale servers with: tuner doctor --kill-stale", file=sys.stderr)
    if d.problems:
        raise typer.Exit(1)


__all__ = ["doctor_cmd"]

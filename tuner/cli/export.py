"""``tuner export``: a study's trials or capacity sweeps as a CSV (or Parquet) file, a
thin shell over :mod:`tuner.report.export`."""
from __future__ import annotations

import sys
from enum import Enum

import typer

from tuner.cli.app import app
from tuner.cli.options import storage_option
from tuner.cli.storage import study_argument
from tuner.core.errors import InputError
from tuner.report.export import TABLES, export, formats, table, to_bytes

#: The formats this installation can write (Parquet needs pyarrow), as --format's choices.
Format = Enum("Format", {f: f for f in formats()}, type=str)  # type: ignore[misc]
What = Enum("What", {w: w for w in TABLES}, type=str)  # type: ignore[misc]


@app.command("export", short_help="Write a study's trials or plan sweeps as CSV for pandas.")
def export_cmd(
    study: str | None = typer.Argument(
        None, metavar="STUDY", help="The study: a name in studies/ (tuner studies lists them), a studies/NAME.db "
                                      "file, or a storage URL holding one study. Default: the newest in studies/."),
    what: What = typer.Option("trials", "--what", help="trials: one row per trial (configuration, every "  # type: ignore[assignment]
                              "percentile, why it did not count); plan: every load sweep tuner plan stored, one "
                              "row per run."),
    fmt: Format = typer.Option("csv", "--format", "-f", help="File format: csv, or json (a list of row objects: "  # type: ignore[assignment]
                               "pandas.read_json(FILE) reads it), e.g. --format json"
                               + ("" if "parquet" in formats() else " (parquet too once pyarrow is installed)") + "."),
    out: str | None = typer.Option(None, "--out", metavar="FILE", help="Where to write; - writes CSV to stdout. "
                                   "Default: studies/<study>/<what>.<format>, beside the study's report."),
    storage: str | None = storage_option(help="Optuna storage (SQLAlchemy URL) holding STUDY, as given to "
                                              "tuner search --storage."),
) -> None:
    """Write a study's trials, or the load sweeps of its capacity plans, as a file.

    For pandas and spreadsheets: pandas.read_csv (or read_json for --format json) reads
    it back with the columns of tuner.study.analysis.trials_frame (or plan_sweep, with the plan
    each row belongs to). Trial rows carry vllm bench serve's names beside tuner's:
    request_throughput, output_throughput, total_token_throughput,
    mean/median/std/p90/p95/p99 of ttft, tpot, itl and e2el in ms (_ms), and
    max_concurrency or request_rate as numbers.
    Credentials in any text are masked, so the file can be shared.

    \b
    Examples:
      tuner export
      tuner export NAME --what plan --out sweeps.csv
      tuner export NAME --format json --out trials.json
      tuner export --out - | head
    """

    kind, fmt_name = what.value, fmt.value
    st = study_argument(study, storage, "export")
    if out == "-":
        if fmt_name == "parquet":
            raise InputError("--out - writes CSV or JSON only", hint="give --out FILE for parquet")
        sys.stdout.write(to_bytes(table(st, kind), fmt_name).decode("utf-8"))
        return
    path = export(st, kind, fmt_name, out)
    import pandas as pd

    read = {"csv": pd.read_csv, "json": pd.read_json, "parquet": pd.read_parquet}[fmt_name]
    rows = len(read(path))
    typer.echo(f"wrote {path} ({rows:,} {'trials' if kind == 'trials' else 'sweep runs'})")

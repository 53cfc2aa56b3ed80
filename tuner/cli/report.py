"""``tuner report``: write a study's HTML report (figures embedded) and its PNGs."""
from __future__ import annotations

import typer

from tuner.cli.app import app
from tuner.cli.options import storage_option
from tuner.cli.progress import Bar
from tuner.cli.storage import study_argument
from tuner.plots import CAPTIONS
from tuner.report.html import write_report


@app.command("report", short_help="Write a study's HTML report and its figures as PNG files.")
def report_cmd(
    study: str | None = typer.Argument(
        None, metavar="STUDY", help="The study: a name in studies/ (tuner studies lists them), a studies/NAME.db file, or a "  # noqa: E501
                   "storage URL holding one study. Default: the newest study in studies/."),
    storage: str | None = storage_option(help="Optuna storage (SQLAlchemy URL) holding STUDY, as given to "
                                              "tuner search --storage."),
    out: str | None = typer.Option(
        None, "--out", metavar="DIR",
        help="Folder for report.html and the PNG files. Default: studies/<study>/ beside the study's database."),
) -> None:
    """Write a self-contained HTML report of a study and its figures as PNG files.

    The page shows the best feasible configuration and its vllm serve command, the
    optimisation history, which knobs mattered, throughput against P95 TTFT with the
    target and the Pareto front, P95 TTFT against load for the best configurations,
    output tokens/s per user against per GPU over every load point (the front vllm
    bench sweep plot_pareto draws), throughput by GPU layout, the capacity curve when
    tuner plan stored one, the top trials, and why the other trials did not count.
    The figures are embedded (base64 PNG), so report.html can be mailed on its own.
    Exit codes: 0 written, 2 no such study.

    \b
    Examples:
      tuner report
      tuner report NAME --out /tmp/report
      tuner report NAME --storage postgresql://db/tuner
    """

    st = study_argument(study, storage, "report")
    with Bar("report", None) as progress:  # no hooks inside: a spinner and the time spent
        progress.on_phase(f"writing the figures and report.html of {st.study_name}")
        path = write_report(st, out)
    pngs = [f"{n}.png" for n in CAPTIONS if (path.parent / f"{n}.png").is_file()]
    typer.echo(f"wrote {path} ({path.stat().st_size / 1024:,.0f} KiB) and {', '.join(pngs) or 'no figures'}")
    typer.echo(f"open it: xdg-open {path}   (or file://{path.resolve()})")

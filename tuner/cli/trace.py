"""``tuner trace stats`` and ``tuner trace convert``: read a request log, summarise it,
or write it as the tuner's own JSONL (optionally shaped on the way)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from tuner.cli.app import app
from tuner.cli.options import Output
from tuner.cli.output import console, fit
from tuner.cli.output import table as make_table
from tuner.core.errors import InputError
from tuner.traffic import READERS, load_trace, native, shape, trace_stats
from tuner.traffic._rows import SKIP_HINT
from tuner.traffic.workload import Workload

trace_app = typer.Typer(
    help=(
        "Inspect and convert request logs.\n\nFormats: " + ", ".join(READERS) + " (sniffed from the "
        "first line unless --format is given). A malformed row stops the read with file:line and "
        "what is wrong; --skip-bad skips such rows and reports how many and why.\n\n"
        "\b\nExamples:\n  tuner trace stats logs.csv\n  tuner trace convert logs.csv logs.jsonl --end 600"
    ),
    short_help="Inspect and convert request logs.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(trace_app, name="trace")

FORMAT_HELP = "Trace format: " + ", ".join(READERS) + ". Default: sniffed from the file's first line."
SKIP_HELP = "Skip malformed rows instead of stopping at the first; the summary says how many and why."
MAP_HELP = (
    "Column mapping for --format generic, repeatable: prompt_tokens=COL, output_tokens=COL, "
    "arrival=COL, time_unit=s|ms|us|ns|datetime, session=COL, turn=COL."
)
TOKENIZER_HELP = (
    "Local model folder whose tokenizer counts tokens of text logs (sharegpt, vllm-bench, "
    "openai-log). Without it counts are estimated and labelled as estimates."
)


@contextmanager
def bad_rows_advice(trace: str | None) -> Iterator[None]:
    """For a command that reads ``--trace`` but keeps every row (``tuner search``: a study
    records the file it read, and ``tuner plan`` replays that file whole): a bad row's
    message advises what that command can do, a cleaned copy to give as ``--trace``,
    instead of a ``--skip-bad`` it does not take."""

    try:
        yield
    except InputError as err:
        if err.hint != SKIP_HINT:
            raise
        clean = f"{Path(err.path or trace or 'trace').stem}-clean.jsonl"
        raise InputError(err.message, path=err.path, line=err.line,
                         hint=f"write a copy without the bad rows with tuner trace convert {err.path or trace} "
                              f"{clean} --skip-bad, then give --trace {clean}") from err


def parse_mapping(items: list[str] | None) -> dict[str, str] | None:
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InputError(f"cannot read --map {item!r}", hint="write KEY=COLUMN, e.g. --map prompt_tokens=in_len")
        out[key.strip()] = value.strip()
    return out


def _load(file: str, fmt: str | None, skip_bad: bool, mapping: list[str] | None, tokenizer: str | None) -> Workload:
    return load_trace(file, format=fmt, skip_bad=skip_bad, mapping=parse_mapping(mapping), tokenizer=tokenizer)


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def render_stats(stats: dict) -> None:

    est = " (estimated)" if stats["estimated_tokens"] else ""
    out = console()
    out.print(f"{stats['source']}, fingerprint {stats['fingerprint']}", markup=False, highlight=False)
    table = make_table()
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("requests", f"{stats['count']:,}")
    table.add_row("span", f"{_fmt(stats['span_s'])} s")
    table.add_row("mean rate", f"{_fmt(stats['mean_rate_rps'], 2)} req/s")
    table.add_row("burstiness (dispersion, 1 s)", _fmt(stats["burstiness"], 2))
    for key, label in (("input_tokens", "input tokens"), ("output_tokens", "output tokens")):
        d = stats[key]
        table.add_row(f"{label}{est} mean / p50 / p95 / max",
                      f"{_fmt(d['mean'])} / {_fmt(d['p50'], 0)} / {_fmt(d['p95'], 0)} / {_fmt(d['max'], 0)}")
    reuse = stats["prefix_reuse"]
    table.add_row(
        "prefix reuse (ideal hit ratio)",
        "-" if reuse is None else f"{100 * reuse:.1f} % of {stats['block_tokens']}-token blocks",
    )
    table.add_row("sessions", "-" if stats["sessions"] is None else f"{stats['sessions']:,}")
    out.print(fit(table, out))
    for note in stats["notes"]:
        out.print(f"note: {note}", markup=False, highlight=False)


STATS_HELP = (
    "Summarise a request log.\n\nCount, span, mean rate, burstiness (index of dispersion of 1-second "
    "arrival counts; 1 is Poisson, more is burstier), input/output token mean/P50/P95/max, ideal "
    "prefix reuse (share of prompt blocks an infinite prefix cache would hit) and sessions.\n\n"
    "\b\nExamples:\n  tuner trace stats AzureLLMInferenceTrace_conv.csv\n"
    "  tuner trace stats bad.csv --skip-bad --output json"
)
CONVERT_HELP = (
    "Write a request log as tuner's own JSONL, optionally cut, sampled, sped up.\n\n"
    "Windowed, sampled, sped up and truncated in that order. The file reads back exactly (same fingerprint); read back, its source is the "  # noqa: E501
    "file itself (what a study or plan names and replays) and the log it came from is its first note.\n\n"
    "\b\nExamples:\n  tuner trace convert azure.csv azure-40s.jsonl --end 40\n"
    "  tuner trace convert bad.csv clean.jsonl --skip-bad"
)


@trace_app.command("stats", help=STATS_HELP, short_help="Summarise a request log.")
def stats_cmd(
    file: str = typer.Argument(..., metavar="FILE", help="The request log to read (CSV, JSON or JSONL)."),
    fmt: str = typer.Option(None, "--format", "-f", help=FORMAT_HELP),
    skip_bad: bool = typer.Option(False, "--skip-bad", help=SKIP_HELP),
    mapping: list[str] = typer.Option(None, "--map", metavar="KEY=COLUMN", help=MAP_HELP),
    tokenizer: str = typer.Option(None, "--tokenizer", metavar="FOLDER", help=TOKENIZER_HELP),
    output: Output = typer.Option(Output.text, "--output", "-o",
                                  help="text: a readable summary; json: every figure, for scripts."),
) -> None:
    stats = trace_stats(_load(file, fmt, skip_bad, mapping, tokenizer))
    if output is Output.json:
        typer.echo(json.dumps(stats, indent=2))
    else:
        render_stats(stats)


@trace_app.command("convert", help=CONVERT_HELP, short_help="Write a log as tuner's JSONL (cut, sampled, sped up).")
def convert_cmd(
    file: str = typer.Argument(..., metavar="FILE", help="The request log to read."),
    out: str = typer.Argument(..., metavar="OUT", help="Where to write the tuner's JSONL (read back with --format tuner)."),  # noqa: E501
    fmt: str = typer.Option(None, "--format", "-f", help=FORMAT_HELP),
    skip_bad: bool = typer.Option(False, "--skip-bad", help=SKIP_HELP),
    mapping: list[str] = typer.Option(None, "--map", metavar="KEY=COLUMN", help=MAP_HELP),
    tokenizer: str = typer.Option(None, "--tokenizer", metavar="FOLDER", help=TOKENIZER_HELP),
    start: float = typer.Option(None, "--start", help="Keep requests from this many seconds after the first."),
    end: float = typer.Option(None, "--end", help="Keep requests before this many seconds after the first."),
    sample_n: int = typer.Option(None, "--sample", help="Keep this many requests, chosen at random (seeded)."),
    seed: int = typer.Option(0, "--seed", help="Seed for --sample."),
    multiplier: float = typer.Option(None, "--multiplier",
                                     help="Compress time: 2 replays the log twice as fast."),
    max_model_len: int = typer.Option(None, "--max-model-len",
                                      help="Cut prompts so that prompt + output fit this many tokens."),
) -> None:

    w = _load(file, fmt, skip_bad, mapping, tokenizer)
    if start is not None or end is not None:
        w = shape.window(w, start, end)
    if sample_n is not None:
        w = shape.sample(w, sample_n, seed=seed)
    if multiplier is not None:
        w = shape.scale_rate(w, multiplier)
    if max_model_len is not None:
        w, _ = shape.truncate(w, max_model_len)
    native.write(w, out)
    # what was cut or kept is one of the workload's notes, printed below
    typer.echo(f"wrote {len(w):,} requests to {out} (fingerprint {w.fingerprint()})")
    for note in w.notes:
        typer.echo(f"note: {note}")

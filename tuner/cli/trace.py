"""``tuner trace stats`` and ``tuner trace convert``: read a request log, summarise it,
or write it as the tuner's own JSONL (optionally shaped on the way)."""
from __future__ import annotations

import json

import typer

from tuner.cli import app
from tuner.errors import InputError
from tuner.traffic import READERS, load_trace, trace_stats
from tuner.traffic.workload import Workload

trace_app = typer.Typer(
    help=(
        "Inspect and convert request logs. Formats: " + ", ".join(READERS) + " (sniffed from the "
        "first line unless --format is given). A malformed row stops the read with file:line and "
        "what is wrong; --skip-bad skips such rows and reports how many and why."
    ),
    no_args_is_help=True,
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
    from rich.console import Console
    from rich.table import Table

    est = " (estimated)" if stats["estimated_tokens"] else ""
    table = Table(title=f"{stats['source']}  [dim]fingerprint {stats['fingerprint']}[/dim]", show_header=True)
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
    console = Console()
    console.print(table)
    for note in stats["notes"]:
        console.print(f"note: {note}")


STATS_HELP = (
    "Summarise a request log: count, span, mean rate, burstiness (index of dispersion of 1-second "
    "arrival counts; 1 is Poisson, more is burstier), input/output token mean/P50/P95/max, ideal "
    "prefix reuse (share of prompt blocks an infinite prefix cache would hit) and sessions."
)
CONVERT_HELP = (
    "Write a request log as the tuner's own JSONL, optionally windowed, sampled, sped up and "
    "truncated (in that order). The file reads back exactly (same fingerprint); read back, its source is the "
    "file itself (what a study or plan names and replays) and the log it came from is its first note."
)


@trace_app.command("stats", help=STATS_HELP)
def stats_cmd(
    file: str = typer.Argument(..., help="The request log to read (CSV, JSON or JSONL)."),
    fmt: str = typer.Option(None, "--format", "-f", help=FORMAT_HELP),
    skip_bad: bool = typer.Option(False, "--skip-bad", help=SKIP_HELP),
    mapping: list[str] = typer.Option(None, "--map", help=MAP_HELP),
    tokenizer: str = typer.Option(None, "--tokenizer", help=TOKENIZER_HELP),
    output: str = typer.Option("table", "--output", "-o",
                               help="table (a readable summary) or json (every figure, for scripts)."),
) -> None:
    if output not in ("table", "json"):
        raise InputError(f"--output must be table or json, got {output!r}")
    stats = trace_stats(_load(file, fmt, skip_bad, mapping, tokenizer))
    if output == "json":
        typer.echo(json.dumps(stats, indent=2))
    else:
        render_stats(stats)


@trace_app.command("convert", help=CONVERT_HELP)
def convert_cmd(
    file: str = typer.Argument(..., help="The request log to read."),
    out: str = typer.Argument(..., help="Where to write the tuner's JSONL (read back with --format tuner)."),
    fmt: str = typer.Option(None, "--format", "-f", help=FORMAT_HELP),
    skip_bad: bool = typer.Option(False, "--skip-bad", help=SKIP_HELP),
    mapping: list[str] = typer.Option(None, "--map", help=MAP_HELP),
    tokenizer: str = typer.Option(None, "--tokenizer", help=TOKENIZER_HELP),
    start: float = typer.Option(None, "--start", help="Keep requests from this many seconds after the first."),
    end: float = typer.Option(None, "--end", help="Keep requests before this many seconds after the first."),
    sample_n: int = typer.Option(None, "--sample", help="Keep this many requests, chosen at random (seeded)."),
    seed: int = typer.Option(0, "--seed", help="Seed for --sample."),
    multiplier: float = typer.Option(None, "--multiplier",
                                     help="Compress time: 2 replays the log twice as fast."),
    max_model_len: int = typer.Option(None, "--max-model-len",
                                      help="Cut prompts so that prompt + output fit this many tokens."),
) -> None:
    from tuner.traffic import native, shape

    w = _load(file, fmt, skip_bad, mapping, tokenizer)
    if start is not None or end is not None:
        w = shape.window(w, start, end)
    if sample_n is not None:
        w = shape.sample(w, sample_n, seed=seed)
    if multiplier is not None:
        w = shape.scale_rate(w, multiplier)
    cut = 0
    if max_model_len is not None:
        w, cut = shape.truncate(w, max_model_len)
    native.write(w, out)
    msg = f"wrote {len(w):,} requests to {out} (fingerprint {w.fingerprint()})"
    if cut:
        msg += f"; truncated {cut:,} to {max_model_len} tokens"
    typer.echo(msg)
    for note in w.notes:
        typer.echo(f"note: {note}")

"""The nightly report: ``nightly.md``, ``nightly.html`` and ``nightly.json`` (the verdict of
:func:`tuner.ops.nightly.compare`) beside the study's ``report.html``."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.core.files import write_atomic
from tuner.ops.night import Night, workload_difference
from tuner.report.html import write_report

if TYPE_CHECKING:
    import optuna

    from tuner.ops.nightly import Verdict


def render_markdown(verdict: Verdict, history: list[Night], study_name: str) -> str:
    n = verdict.night
    lines = [f"# Nightly tuning: {study_name}, {n.date}", "", f"**{verdict.headline}**", ""]
    if verdict.regression and verdict.change is not None:
        lines += [f"Regression size: {verdict.change:+.1%} "
                  f"({(n.tokens_per_s or 0) - verdict.baseline.tokens_per_s:+,.0f} tok/s).", ""]
    if n.rerun_of_previous is not None and verdict.previous is not None:
        lines += [f"The previous night's best configuration (trial {verdict.previous.trial}), re-run tonight: "
                  f"{n.rerun_of_previous:,.0f} tok/s (it made {verdict.previous.tokens_per_s or 0:,.0f} tok/s "
                  f"on {verdict.previous.date}).", ""]
    best = "none feasible" if n.tokens_per_s is None else f"{n.tokens_per_s:,.0f} tok/s (trial {n.trial})"
    lines += [f"Tonight: {n.new_trials} trials, best {best}; workload {n.workload.get('requests')} requests, "
              f"fingerprint {n.fingerprint}, shape {n.shape}.", ""]
    if n.config:
        lines += ["Best configuration: " + ", ".join(f"{k}={v}" for k, v in n.config.items() if v is not None), ""]
    lines += ["| night | best tok/s | change vs previous | workload shape | fingerprint | trials |",
              "| --- | ---: | ---: | --- | --- | ---: |"]
    rows = [*history, n]
    for i, row in enumerate(rows):
        prev = rows[i - 1] if i else None
        change = ""
        if prev is not None and prev.tokens_per_s and row.tokens_per_s is not None:
            change = f"{row.tokens_per_s / prev.tokens_per_s - 1:+.1%}" + (
                "" if workload_difference(prev, row) is None else " (another workload)")
        tok = "-" if row.tokens_per_s is None else f"{row.tokens_per_s:,.0f}"
        lines.append(f"| {row.started_at} | {tok} | {change} | {row.shape} | {row.fingerprint} | {row.new_trials} |")
    lines += ["", "The full study report: [report.html](report.html)."]
    return "\n".join(lines) + "\n"


def write_nightly_report(study: optuna.Study, verdict: Verdict, history: list[Night], folder: Path) -> Path:
    """``nightly.md``, ``nightly.html`` and ``nightly.json`` (the verdict), and the study
    report (``report.html``, :mod:`tuner.report.html`) in ``folder``; returns nightly.html."""
    folder.mkdir(parents=True, exist_ok=True)
    text = render_markdown(verdict, history, study.study_name)

    write_atomic(folder / "nightly.md", text)
    write_atomic(folder / "nightly.json", json.dumps({
        "study": study.study_name, "headline": verdict.headline, "regression": verdict.regression,
        "change": verdict.change, "threshold": verdict.threshold, "workload_changed": verdict.workload_changed,
        "workload_difference": verdict.difference,
        "night": verdict.night.to_dict(),
        "baseline": None if verdict.baseline is None else verdict.baseline.to_dict(),
    }, indent=2))
    study_report = ""
    try:
        write_report(study, folder)
        study_report = '<p><a href="report.html">The full study report</a></p>'
    except ImportError:  # tuner.report.html absent from this build: the Markdown stands alone
        pass
    page = (f"<!doctype html><meta charset=utf-8><title>{html.escape(study.study_name)} nightly</title>"
            f"<pre>{html.escape(text)}</pre>{study_report}")
    return write_atomic(folder / "nightly.html", page)


__all__ = ["render_markdown", "write_nightly_report"]

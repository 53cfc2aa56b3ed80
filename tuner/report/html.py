"""``tuner report``: one self-contained HTML page about a study, for the on-call engineer
who opens last night's run in a browser.

:func:`write_report` writes ``report.html`` (every figure of :func:`tuner.plots.study_plots`
embedded as a base64 PNG, so the file can be mailed or attached alone) and the same
figures as PNG files beside it, by default in ``studies/<study>/`` next to the study's
database. The page holds the answer (best feasible configuration and its ``vllm serve``
command), the figures with a caption on how to read each, the top configurations (trials
that differ only in knobs without effect on the workload counted as one), the trials that
did not count and why, and the capacity plan when ``tuner plan`` stored one.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.core.files import write_atomic, write_fault
from tuner.core.knobs import KNOBS
from tuner.core.urls import redact
from tuner.plan import load_plan, summary_rows
from tuner.plots import CAPTIONS, plan_command, png_bytes, study_plots, study_slos
from tuner.search import serve_command
from tuner.serving.result import describe_errors
from tuner.serving.slo import OBJECTIVES, SloSet
from tuner.study import closest_miss, confirmation, error_totals, miss_explanation, storage_handle, trial_config
from tuner.study import repeats as confirmation_repeats
from tuner.study.analysis import best_trial, study_location, target_ttft_s, top_groups, trials_frame
from tuner.study.effective import ANY
from tuner.study.race import confirmation_rows
from tuner.study.record import StudyRecord, TrialRecord
from tuner.study.storage import STUDIES_DIR

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from optuna.trial import FrozenTrial

REPORT_NAME = "report.html"
#: The knob columns of the top-configurations table: every row of :data:`tuner.core.knobs.KNOBS`,
#: in its order (a knob the study did not vary is left out where the frame has no column).
KNOB_COLUMNS = tuple(k.name for k in KNOBS)
#: Columns of the top-configurations table (:func:`tuner.study.analysis.top_groups`).
TOP_COLUMNS = ("number", "trials", "tokens/s", "ttft_p95_s", "chosen_load", "errors", "layout", *KNOB_COLUMNS)
#: Left-aligned (text) columns of that table: a folded knob reads "any (why)"; a switch or a
#: choice of words reads as words, and max_model_len as the model's own where unset.
_TOP_TEXT = ("trials", "chosen_load", "errors", "layout", "max_model_len",
             *(k.name for k in KNOBS if k.type in (bool, str)))
#: Headers a person reads, for the columns whose frame names are not.
_HEADERS = {"number": "trial", "tokens/s": "tokens/s (min–max)",
            "ttft_p95_s": "P95 TTFT (s)", "chosen_load": "at load"}

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1250px;color:#222;
     padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#555} table{border-collapse:collapse;font-size:.85em;margin:.6em 0}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right} th{background:#f3f3f3}
td{white-space:pre} td.l{white-space:normal}
td.l,th.l{text-align:left} td.l{max-width:760px;overflow-wrap:break-word} pre{background:#f6f6f6;padding:.8em;overflow-x:auto;white-space:pre-wrap}
@media (max-width:1000px){body{padding:0 .5em} table.top{font-size:.75em} table.top td,table.top th{padding:2px 3px}}
figure{margin:1.2em 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#444;max-width:900px} .skipped{color:#a60}
"""  # noqa: E501


def default_report_dir(study: optuna.Study) -> Path:
    """``<folder of the study's .db>/<study name>/`` (``studies/<name>/`` by default), or
    ``studies/<name>/`` for a study in another database."""
    db = study_location(study)
    folder = db.parent if db is not None else STUDIES_DIR
    return folder / study.study_name


def _url(study: optuna.Study) -> str:
    db = study_location(study)
    return redact(f"sqlite:///{db}") if db is not None else "<your --storage URL>"


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def _header(column: str) -> str:
    """A column's header: a name a person reads, or the knob's own name with places to
    wrap after each underscore (gpu_memory_utilization takes one word's width)."""
    return _HEADERS.get(column) or html.escape(column).replace("_", "_<wbr>")


def _knob(value: Any) -> str:
    """A knob's value; not set means vLLM's default for the version, GPU and model."""
    return "default" if value is None or (isinstance(value, float) and math.isnan(value)) else _fmt(value)


def _table(frame: pd.DataFrame, columns: list[str], left: tuple[str, ...] = (), cls: str = "") -> str:
    """A table of ``frame``'s ``columns``: numbers right-aligned on one line, the
    ``left`` (text) columns left-aligned and wrapping."""
    cols = [c for c in columns if c in frame.columns]
    head = "".join(f"<th class='{'l' if c in left else ''}'>{_header(c)}</th>" for c in cols)
    body = []
    for _, row in frame.iterrows():
        cells = "".join(f"<td class='{'l' if c in left else ''}'>{html.escape(redact(_fmt(row[c])))}</td>"
                        for c in cols)
        body.append(f"<tr>{cells}</tr>")
    return f"<table class='{cls}'><tr>{head}</tr>{''.join(body)}</table>"


def _pairs(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th class='l'>{html.escape(a)}</th><td class='l'>{html.escape(redact(b))}</td></tr>"
                   for a, b in rows)
    return f"<table>{body}</table>"


def _answer(study: optuna.Study, best: FrozenTrial | None) -> str:
    """The recommended trial (``best``, :func:`tuner.study.analysis.best_trial`) and why."""

    if best is None:
        miss = closest_miss(study)
        text = "No configuration met the target." + (f" {miss_explanation(miss)}." if miss is not None else "")
        errors = TrialRecord.from_trial(miss).errors if miss is not None else None
        if errors:
            text += f" Its failed requests: {describe_errors(errors, limit=8)}."
        return f"<p class='skipped'>{html.escape(redact(text))}</p>"
    config = trial_config(best)
    rec = TrialRecord.from_trial(best)
    objective = StudyRecord.from_study(study).objective or "tokens"
    rows = [("trial", f"#{best.number}"), ("tokens/s (in+out)", f"{rec.tokens_per_s or best.value:,.0f}")]
    if objective == "goodput":  # what the study scored, first
        rows.insert(1, ("goodput (req/s meeting every SLO)", f"{best.value:,.2f}"))
    if rec.summary.get("ttft_p95_s") is not None:
        rows.append(("P95 TTFT", f"{rec.summary['ttft_p95_s']:.3g} s at {rec.chosen_load or '?'}"))
    for slo in [s for s in SloSet.of(rec.slos).slos if s.name != "p95_ttft"] if rec.slos else []:
        value = slo.measured(rec.summary)
        shown = f"{value * 1e3:.3g} ms" if slo.bound_s < 1 else f"{value:.3g} s"
        rows.append((slo.label(), f"{shown} (bound {slo.bound_text(' ')})"))
    if rec.binding_slo and rec.slos:
        rows.append(("binding SLO", rec.binding_slo))
    if rec.errors:
        rows.append(("failed requests", describe_errors(rec.errors, limit=8)))
    conf = confirmation(study)
    if conf is not None and conf.winner != best.number:
        conf = None  # it chose another trial: not the repeats behind this answer
    if conf is not None:  # the repeats that chose it (tuner.study.race)
        rows += confirmation_rows(conf.mean, len(conf.measurements.get(conf.winner, [])), conf.band, conf.ties,
                                  conf.noise.rel_sd, objective)
    rows += [(k, _knob(v)) for k, v in config.to_dict().items()]
    out = _pairs(rows)
    if conf is not None:
        out += f"<p>{html.escape(redact(conf.reason[:1].upper() + conf.reason[1:]))}.</p>"
    dep = StudyRecord.from_study(study).deployment
    if dep is not None:
        try:
            command = serve_command(dep, config)
            out += f"<p>Serve it with:</p><pre>{html.escape(command)}</pre>"
        except Exception as err:  # an older study's deployment record: the table still stands
            out += f"<p class='skipped'>(no serve command: {html.escape(str(err))})</p>"
    return out


def _plan_section(study: optuna.Study) -> str:

    est = load_plan(study)
    if est is None:
        return ("<p class='skipped'>No capacity plan stored yet: run "
                f"<code>{html.escape(plan_command(study))}</code> to add one.</p>")
    return _pairs(summary_rows(est)) + "".join(f"<p class='meta'>{html.escape(n)}</p>" for n in est.notes)


def _top_section(study: optuna.Study, frame: pd.DataFrame, chosen: FrozenTrial | None) -> list[str]:
    """The ten best effective configurations: one row per group of trials, with its count
    and the spread of its throughput; ★ marks the one of ``chosen``, the recommended trial."""
    groups = top_groups(study, 10, frame=frame)
    if not len(groups):
        return []
    top = groups.to_frame()
    # the spread of a configuration's trials under its best: one column, not two, on a narrow page
    top["tokens/s"] = [_fmt(best) + (f"\n{_fmt(lo)}–{_fmt(hi)}" if n > 1 else "") for best, lo, hi, n in
                       zip(top["tokens_per_s"], top["tokens_per_s_min"], top["tokens_per_s_max"], top["trials"])]
    top["trials"] = [f"×{n}" + (f" ({m} missed)" if m else "") for n, m in zip(top["trials"], top["missed"])]
    # the row that holds the study's recommendation (a confirmation may have chosen a trial
    # other than the group's fastest measurement, which names the row)
    marked = [chosen is not None and chosen.number in members for members in top["members"]]
    top["number"] = [f"★ {n}" if m else str(n) for n, m in zip(top["number"], marked)]
    columns = [c for c in TOP_COLUMNS if c != "errors" or top["errors"].notna().any()]
    knobs = KNOB_COLUMNS
    for c in knobs:
        if c in top.columns:
            top[c] = [_knob(v) for v in top[c]]
    # a knob set alike in every row is said once above the table, which then fits the page
    same = [c for c in TOP_COLUMNS[TOP_COLUMNS.index("layout"):] if c in top.columns and len(top) > 1
            and top[c].map(_fmt).nunique() == 1]
    columns = [c for c in columns if c not in same]
    # a folded knob in a column reads "any", and why is said once under the table
    whys: dict[str, str] = {}
    for c in [c for c in columns if c in knobs and c in top.columns]:  # also when layout is said above
        for value in top[c]:
            if isinstance(value, str) and value.startswith(f"{ANY} ("):
                whys.setdefault(c, value[len(ANY) + 2:-1])
        top[c] = [ANY if isinstance(v, str) and v.startswith(f"{ANY} (") else v for v in top[c]]
    folded = top["folded"].notna().any()
    note = ("Trials that differ only in knobs without effect on this study's workload are one row; such a "
            "knob reads <i>any</i>. " if folded else "")
    note += ("<i>trials</i> counts the feasible trials of each configuration (repeats included; <i>missed</i>: "
             "those that ran it and missed the target) and the <i>min–max</i> under <i>tokens/s</i> is the spread of their "  # noqa: E501
             "throughput: noise between repeats, or what the folded knobs did after all. <i>trial</i> is the "
             "configuration's fastest measurement")
    if any(marked):
        note += f"; ★ marks the configuration of the recommended trial #{chosen.number}"
    note += "."
    out = ["<h2>Top feasible configurations</h2>"]
    if groups.caveat:
        out.append(f"<p class='skipped'>{html.escape(groups.caveat)}.</p>")
    out.append(f"<p class='meta'>{note}</p>")
    if same:
        alike = ", ".join(f"{c} {_fmt(top[c].iloc[0])}" for c in same)
        out.append(f"<p>In every row: {html.escape(redact(alike))}.</p>")
    out.append(_table(top, columns, left=_TOP_TEXT, cls="top"))
    if whys:
        said = "; ".join(f"{c}: {why}" for c, why in whys.items())
        out.append(f"<p class='meta'><i>any</i>: the knob has no effect on this workload ({html.escape(redact(said))}).</p>")  # noqa: E501
    return out


def render_report(study: optuna.Study, storage: Any = None) -> tuple[str, dict[str, bytes]]:
    """The HTML page and the PNG bytes of each figure drawn, by figure name. ``storage``:
    the URL or optuna storage of a study opened with optuna itself, where its confirmation
    repeats are read (:func:`tuner.study.storage_handle`)."""
    if storage is not None:
        storage_handle(study, storage)
    frame = trials_frame(study).frame
    plots = study_plots(study, frame)
    pngs = {p.name: png_bytes(p.figure) for p in plots if p.figure is not None}
    target = target_ttft_s(study)
    counts = frame["status"].value_counts().to_dict() if len(frame) else {}
    repeats = len(confirmation_repeats(study))
    best = best_trial(study)
    stamp = StudyRecord.from_study(study)
    dep = stamp.deployment
    where = (f"{dep.gpu_count}x {dep.gpu}, {dep.model}, vLLM {dep.vllm_version}" if dep is not None
             else "deployment not recorded")
    slos = SloSet.of(study_slos(study)).describe() if target is not None else "P95 TTFT ≤ ?"
    meta = (f"{where}; backend {stamp.backend or '?'}; space {stamp.space or '?'}; "
            f"sampler {stamp.sampler or '?'}; target {slos.replace('<=', '≤')}"
            + (f"; objective {stamp.objective} ({OBJECTIVES[stamp.objective]})" if stamp.objective else "")
            + f"; {len(frame)} trials ("
            + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"
            + (f"; {repeats} confirmation repeats outside them" if repeats else ""))
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>tuner report: {html.escape(study.study_name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Study {html.escape(study.study_name)}</h1>",
        f"<p class='meta'>{html.escape(meta)}</p>",
        f"<p class='meta'>Written {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC} by tuner report. "
        "The study is an ordinary Optuna study: <code>pip install optuna-dashboard; optuna-dashboard "
        f"{html.escape(_url(study))}</code> browses it live.</p>",
        "<h2>Best feasible configuration</h2>", _answer(study, best),
        "<h2>Figures</h2>",
    ]
    for p in plots:
        if p.name in pngs:
            data = base64.b64encode(pngs[p.name]).decode("ascii")
            parts.append(f"<figure id='{p.name}'><h3>{html.escape(p.title)}</h3>"
                         f"<img alt='{html.escape(p.title)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{html.escape(p.caption)}</figcaption></figure>")
        else:
            parts.append(f"<h3>{html.escape(p.title)}</h3>"
                         f"<p class='skipped'>Not drawn: {html.escape(p.skipped or '')}</p>")
    parts.append("<h2>Capacity plan</h2>")
    parts.append(_plan_section(study))
    parts += _top_section(study, frame, best)
    bad = frame[frame["reason"].notna()] if len(frame) else frame
    if len(bad):
        columns = ["number", "status", "layout", "reason"] + (["errors"] if bad["errors"].notna().any() else [])
        parts += ["<h2>Trials that did not count</h2>",
                  _table(bad, columns, left=("status", "layout", "reason", "errors"))]
    totals = error_totals(study)
    if totals:
        parts += ["<h2>Failed requests</h2>",
                  f"<p>Over every load point of every trial: {html.escape(describe_errors(totals, limit=12))}. "
                  "A load point fails when more than 1% of its requests fail (an HTTP error, a timeout, a "
                  "broken or short stream); the first message of each kind is stored on the trial "
                  "(<code>error_detail</code>).</p>"]
    parts.append("</body></html>")
    return redact("\n".join(parts)), pngs  # a last pass: no credential reaches the page


def write_report(study: optuna.Study, out_dir: str | Path | None = None, storage: Any = None) -> Path:
    """Write ``report.html`` and ``<figure>.png`` files into ``out_dir`` (default
    :func:`default_report_dir`); returns the HTML file's path. ``storage``: see
    :func:`render_report`."""
    folder = Path(out_dir) if out_dir is not None else default_report_dir(study)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a read-only studies/ folder: one line, pointing at --out

        raise write_fault(folder, err) from None
    page, pngs = render_report(study, storage)
    for name in CAPTIONS:  # a figure not drawn this time leaves no stale PNG behind
        png = folder / f"{name}.png"
        if name in pngs:
            write_atomic(png, pngs[name])  # whole or absent, even on a full disk
        else:
            png.unlink(missing_ok=True)
    return write_atomic(folder / REPORT_NAME, page)


__all__ = ["REPORT_NAME", "default_report_dir", "render_report", "write_report"]

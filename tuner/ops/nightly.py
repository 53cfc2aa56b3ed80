"""Nightly tuning: resume the standing study of a deployment on the latest traffic,
compare tonight's best with earlier nights, flag regressions.

One study per deployment and search space (:func:`nightly_study_name`), not per
workload, so every night adds to the same study: the sampler starts from what earlier
nights learned. Each night:

1. takes the lock of the study (:class:`~tuner.study.workers.StudyLock`, purpose ``nightly``:
   a PostgreSQL advisory lock, or a lock file beside a SQLite database); a second run on
   the same study exits at once with :class:`~tuner.study.workers.StudyBusy`;
2. re-runs the previous night's best configuration first (on tonight's workload), then
   searches for ``trials`` new trials or until the wall-clock budget is spent; tonight's
   trials carry ``night`` (the run's start, ISO UTC) and only reuse results among
   themselves (a configuration measured last night is measured again);
3. appends a record to the study's user attr ``nights`` (:class:`Night`: date, workload
   fingerprint and shape, best throughput and configuration, last night's best re-run);
4. compares (:func:`compare`) and writes ``nightly.md``, ``nightly.html``,
   ``nightly.json`` and the study report (:func:`tuner.report.html.write_report`).

**Workload changes are not regressions.** Tonight is compared with the latest earlier
night whose workload has the same *shape* (:func:`workload_shape`: mean prompt and
output tokens in half-octave bins, and the share of prompt blocks that repeat). A
24-hour window of a real log has a new fingerprint every night, but the same shape
while the traffic mix holds; when the shape moves (longer prompts, shorter answers)
the report says what changed and makes no throughput verdict against nights of the
other shape. Throughput more than ``threshold`` below the comparable night is a
regression: :data:`REGRESSION_EXIT` (4) from ``tuner nightly``.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import html
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError, TunerError
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    import optuna

    from tuner.runtime.progress import Observer
    from tuner.search.backend import Backend
    from tuner.serving.config import Deployment
    from tuner.space import SearchSpace
    from tuner.traffic.workload import Workload

NIGHTS_ATTR = "nights"
REGRESSION_EXIT = 4  # RegressionDetected.exit_code
DEFAULT_THRESHOLD = 0.10


def parse_threshold(text: str) -> float:
    """``"10%"`` or ``"0.1"`` → 0.1."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise InputError(f"cannot read --threshold {text!r}", hint="write a drop such as 10% or 0.1")
    return value


class RegressionDetected(TunerError):
    """Tonight's best throughput fell more than the threshold below a comparable night."""

    exit_code = 4


# -- names and workloads -----------------------------------------------------------------
def nightly_study_name(deployment: Deployment, space_name: str = "default", backend: str = "sim") -> str:
    """``nightly.1xH100-SXM.qwen2.5-7b.default``: stable across nights and workloads."""
    import re

    raw = f"nightly.{deployment.label()}.{space_name}" + ("" if backend == "sim" else f".{backend}")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw)


def latest_window(workload: Workload, seconds: float) -> Workload:
    """The last ``seconds`` of a request log (``--window 24h``), rebased to 0."""
    from tuner.traffic.shape import window

    if seconds <= 0:
        raise InputError(f"--window must be positive, got {seconds:g} s")
    if workload.span_s <= seconds:
        return workload
    return window(workload, workload.span_s - seconds, None)


def workload_shape(workload: Workload) -> str:
    """``p9.0/o7.5/r0.3``: log2 of the mean prompt and output tokens rounded to half
    octaves (a ~41% step), and the share of prompt blocks seen before in the window
    rounded to 0.1 (``r-`` without block ids). Equal shapes compare; different ones mean
    the traffic mix changed."""
    import numpy as np

    def half_octave(x: float) -> str:
        return f"{round(2 * math.log2(max(float(x), 1.0))) / 2:.1f}"

    text = f"p{half_octave(np.mean(workload.prompt_tokens))}/o{half_octave(np.mean(workload.output_tokens))}"
    ids = workload.hash_ids
    if ids is None:
        return text + "/r-"
    seen: set[int] = set()
    total = repeated = 0
    for blocks in ids:
        for b in blocks:
            total += 1
            repeated += int(b) in seen
            seen.add(int(b))
    return text + f"/r{round(repeated / total, 1) if total else 0.0:.1f}"


def describe(workload: Workload) -> dict[str, Any]:
    import numpy as np

    return {"requests": len(workload), "span_s": round(float(workload.span_s), 3),
            "mean_prompt_tokens": round(float(np.mean(workload.prompt_tokens)), 1),
            "mean_output_tokens": round(float(np.mean(workload.output_tokens)), 1),
            "source": workload.source}


# -- nights ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Night:
    """One nightly run, as stored in the study's ``nights`` user attr."""

    started_at: str                      # ISO 8601 UTC; also the ``night`` tag of its trials
    date: str                            # YYYY-MM-DD (UTC)
    fingerprint: str
    shape: str
    tokens_per_s: float | None           # tonight's best feasible throughput (None: none feasible)
    trial: int | None
    config: dict[str, Any] | None
    new_trials: int                      # tonight's trials of the budget (--trials)
    workload: dict[str, Any] = field(default_factory=dict)
    deployment: dict[str, Any] = field(default_factory=dict)
    rerun_of_previous: float | None = None  # the previous night's best config, measured tonight
    repeats: int = 0                     # confirmation re-measurements of tonight's best (outside --trials)

    def __post_init__(self) -> None:
        if self.tokens_per_s is not None and not self.tokens_per_s >= 0:
            raise InputError(f"night {self.started_at}: throughput must be >= 0, got {self.tokens_per_s}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Night:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def nights(study: optuna.Study) -> list[Night]:
    return [Night.from_dict(n) for n in study.user_attrs.get(NIGHTS_ATTR) or []]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Tonight against the earlier nights."""

    night: Night
    previous: Night | None               # the latest earlier night
    baseline: Night | None               # the latest earlier night with tonight's workload shape
    change: float | None                 # tonight / baseline - 1
    threshold: float
    workload_changed: bool               # the previous night's shape differs from tonight's
    regression: bool

    @property
    def headline(self) -> str:
        n, b = self.night, self.baseline
        if self.regression and b is not None and self.change is not None:
            return (f"REGRESSION: best throughput {n.tokens_per_s or 0:,.0f} tok/s tonight vs "
                    f"{b.tokens_per_s:,.0f} tok/s on {b.date} ({self.change:+.1%}, threshold "
                    f"-{self.threshold:.0%}) on the same workload shape {n.shape}")
        parts = []
        if self.workload_changed and self.previous is not None:
            parts.append(f"workload changed since {self.previous.date}: shape {self.previous.shape} -> {n.shape}"
                         f" ({_shape_change(self.previous, n)}); not compared as a regression")
        if b is not None and self.change is not None:
            parts.append(f"no regression: {n.tokens_per_s or 0:,.0f} tok/s vs {b.tokens_per_s:,.0f} tok/s on "
                         f"{b.date} ({self.change:+.1%}, threshold -{self.threshold:.0%})")
        elif b is None and not parts:
            parts.append("first night on this deployment: nothing to compare with yet")
        elif b is None:
            parts.append("no earlier night with this workload shape")
        return "; ".join(parts)


def _shape_change(before: Night, after: Night) -> str:
    out = []
    for key, word in (("mean_prompt_tokens", "mean prompt"), ("mean_output_tokens", "mean output")):
        a, b = before.workload.get(key), after.workload.get(key)
        if a and b:
            out.append(f"{word} {a:,.0f} -> {b:,.0f} tokens")
    return ", ".join(out) or "see the shapes"


def compare(night: Night, history: list[Night], threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    """Tonight against the latest earlier night of the same workload shape; a drop of
    more than ``threshold`` is a regression. A night with no feasible configuration
    counts as 0 tok/s; an earlier night with none is no baseline."""
    if not 0 < threshold < 1:
        raise InputError(f"--threshold must be between 0 and 100%, got {threshold:.0%}")
    earlier = [n for n in history if n.started_at < night.started_at]
    previous = earlier[-1] if earlier else None
    same = [n for n in earlier if n.shape == night.shape and n.tokens_per_s]
    baseline = same[-1] if same else None
    change = None
    if baseline is not None:
        change = (night.tokens_per_s or 0.0) / baseline.tokens_per_s - 1.0
    return Verdict(
        night=night, previous=previous, baseline=baseline, change=change, threshold=threshold,
        workload_changed=previous is not None and previous.shape != night.shape,
        regression=change is not None and change < -threshold,
    )


# -- the run -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NightlyOutcome:
    study: Any
    name: str
    storage: str
    verdict: Verdict
    report: Path
    wall_s: float

    @property
    def exit_code(self) -> int:
        return REGRESSION_EXIT if self.verdict.regression else 0


def run_nightly(
    space: SearchSpace,
    workload: Workload,
    *,
    backend: Backend | str = "sim",
    storage: str | None = None,
    study: str | None = None,
    trials: int = 20,
    wall_clock_s: float | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    report_dir: str | Path | None = None,
    seed: int = 0,
    now: dt.datetime | None = None,
    observer: Observer | None = None,
    backend_options: Mapping[str, Any] | None = None,
) -> NightlyOutcome:
    """One night (see the module docstring). ``space`` must be bound
    (:func:`tuner.search.prepare`); ``workload`` is tonight's traffic (e.g.
    :func:`latest_window` of the log); ``backend`` a name (constructor options in
    ``backend_options``) or a backend."""
    import time

    from tuner.search import backend_for, run_search
    from tuner.study import open_study, repeats
    from tuner.study.locks import StudyBusy, StudyLock
    from tuner.study.storage import default_storage, is_shared
    from tuner.study.workers import budget_used

    if trials < 1:
        raise InputError(f"--trials must be >= 1, got {trials}")
    t0 = time.perf_counter()
    name = study or nightly_study_name(space.deployment, space.name, backend if isinstance(backend, str) else backend.name)
    backend_obj = backend_for(backend, name, backend_options)
    url = storage or default_storage(name)
    started = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    started_at = started.isoformat(timespec="seconds")
    with StudyLock(url, name, "nightly") as lock:
        if not lock.acquire(blocking=False):
            raise StudyBusy(f"a nightly run of study {name!r} ({url}) is already running ({lock.holder()})",
                            hint="wait for it to finish; one nightly run per study at a time")
        st = open_study(name, url)
        history = nights(st)
        previous = history[-1] if history else None
        if previous is not None and previous.trial is not None:
            # tonight's first trial: last night's best, on tonight's workload
            st.enqueue_trial(st.trials[previous.trial].params,
                             user_attrs=TrialRecord(rerun_of_night=previous.started_at).to_attrs())
        used = budget_used(st, shared=is_shared(url))[0]
        tags = {"night": started_at}
        run_search(space, backend=backend_obj, workload=workload, budget=used + trials, timeout_s=wall_clock_s,
                   storage=url, study=name, seed=seed, observer=observer, tags=tags)
        st = open_study(name, url)
        records = {t.number: TrialRecord.from_trial(t) for t in st.get_trials(deepcopy=False)}
        tonight_all = [t for t in st.get_trials(deepcopy=False) if records[t.number].tags.get("night") == started_at]
        tonight = [t for t in tonight_all if not records[t.number].is_confirmation]
        confirmed = [t for t in repeats(st) if TrialRecord.from_trial(t).tags.get("night") == started_at]
        best = max((t for t in tonight if _feasible(t)), key=lambda t: (t.value, -t.number), default=None)
        rerun = next((t for t in tonight if records[t.number].rerun_of_night), None)
        night = Night(
            started_at=started_at, date=started.date().isoformat(), fingerprint=workload.fingerprint(),
            shape=workload_shape(workload), tokens_per_s=None if best is None else float(best.value),
            trial=None if best is None else best.number,
            config=None if best is None else records[best.number].config.to_dict(), new_trials=len(tonight),
            repeats=len(confirmed), workload=describe(workload), deployment=space.deployment.to_dict(),
            rerun_of_previous=None if rerun is None else (float(rerun.value) if _feasible(rerun) else 0.0),
        )
        st.set_user_attr(NIGHTS_ATTR, [n.to_dict() for n in history] + [night.to_dict()])
        verdict = compare(night, history, threshold)
        folder = Path(report_dir) if report_dir is not None else Path("studies") / name / "nightly"
        if observer is not None:
            observer.on_phase("writing the report")
        report = write_nightly_report(st, verdict, history, folder)
    return NightlyOutcome(st, name, url, verdict, report, time.perf_counter() - t0)


def _feasible(trial: Any) -> bool:
    from tuner.study import is_feasible

    return is_feasible(trial)


# -- the report --------------------------------------------------------------------------
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
            change = f"{row.tokens_per_s / prev.tokens_per_s - 1:+.1%}" + ("" if prev.shape == row.shape else " (new shape)")
        tok = "-" if row.tokens_per_s is None else f"{row.tokens_per_s:,.0f}"
        lines.append(f"| {row.started_at} | {tok} | {change} | {row.shape} | {row.fingerprint} | {row.new_trials} |")
    lines += ["", "The full study report: [report.html](report.html)."]
    return "\n".join(lines) + "\n"


def write_nightly_report(study: optuna.Study, verdict: Verdict, history: list[Night], folder: Path) -> Path:
    """``nightly.md``, ``nightly.html`` and ``nightly.json`` (the verdict), and the study
    report (``report.html``, :mod:`tuner.report.html`) in ``folder``; returns nightly.html."""
    folder.mkdir(parents=True, exist_ok=True)
    text = render_markdown(verdict, history, study.study_name)
    from tuner.core.files import write_atomic

    write_atomic(folder / "nightly.md", text)
    write_atomic(folder / "nightly.json", json.dumps({
        "study": study.study_name, "headline": verdict.headline, "regression": verdict.regression,
        "change": verdict.change, "threshold": verdict.threshold, "workload_changed": verdict.workload_changed,
        "night": verdict.night.to_dict(),
        "baseline": None if verdict.baseline is None else verdict.baseline.to_dict(),
    }, indent=2))
    study_report = ""
    try:
        from tuner.report.html import write_report

        write_report(study, folder)
        study_report = '<p><a href="report.html">The full study report</a></p>'
    except ImportError:  # tuner.report.html absent from this build: the Markdown stands alone
        pass
    page = (f"<!doctype html><meta charset=utf-8><title>{html.escape(study.study_name)} nightly</title>"
            f"<pre>{html.escape(text)}</pre>{study_report}")
    return write_atomic(folder / "nightly.html", page)


__all__ = ["DEFAULT_THRESHOLD", "NIGHTS_ATTR", "REGRESSION_EXIT", "Night", "NightlyOutcome", "RegressionDetected",
           "Verdict",
           "compare", "latest_window", "nightly_study_name", "nights", "run_nightly", "workload_shape",
           "write_nightly_report"]

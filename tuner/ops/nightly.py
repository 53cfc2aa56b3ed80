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
output tokens in half-octave bins, and the share of prompt blocks that repeat) and the
same size: requests and load (requests per second of the log) within
:data:`LIKE_FACTOR` of tonight's (:func:`workload_difference`). A 24-hour window of a real
log has a new fingerprint every night, but the same shape and size while the traffic
holds; when the shape moves (longer prompts, shorter answers) or the night is quiet (12
requests where there were 200: the study cannot offer the load it offered before, so its
best throughput falls with the traffic, not with the configuration) the report says
what changed and makes no throughput verdict against nights of another workload. Throughput more than ``threshold`` below the comparable night is a
regression: :data:`REGRESSION_EXIT` (4) from ``tuner nightly``.
"""  # noqa: E501
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError, TunerError
from tuner.ops.night import LIKE_FACTOR, NIGHTS_ATTR, Night, nights, workload_difference
from tuner.ops.nightly_report import write_nightly_report
from tuner.search import backend_for, run_search
from tuner.search.settings import check_seed
from tuner.study import is_feasible, open_study, repeats
from tuner.study.locks import StudyBusy, StudyLock
from tuner.study.record import TrialRecord
from tuner.study.storage import default_storage, is_shared
from tuner.study.workers import budget_used
from tuner.traffic.shape import window

if TYPE_CHECKING:

    from tuner.runtime.progress import Observer
    from tuner.search.backend import Backend
    from tuner.serving.config import Deployment
    from tuner.space import SearchSpace
    from tuner.traffic.workload import Workload

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


# -- nights (tuner.ops.night) ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Verdict:
    """Tonight against the earlier nights."""

    night: Night
    previous: Night | None               # the latest earlier night
    baseline: Night | None               # the latest earlier night with tonight's workload shape
    change: float | None                 # tonight / baseline - 1
    threshold: float
    workload_changed: bool               # the previous night's workload differs from tonight's (shape, size, load)
    regression: bool
    difference: str | None = None        # how (``shape p9.0/o7.5/r- -> ...``, ``200 -> 12 requests``)

    @property
    def headline(self) -> str:
        n, b = self.night, self.baseline
        if self.regression and b is not None and self.change is not None:
            return (f"REGRESSION: best throughput {n.tokens_per_s or 0:,.0f} tok/s tonight vs "
                    f"{b.tokens_per_s:,.0f} tok/s on {b.date} ({self.change:+.1%}, threshold "
                    f"-{self.threshold:.0%}) on the same workload (shape {n.shape}, "
                    f"{n.workload.get('requests', 0):,} requests)")
        parts = []
        if self.workload_changed and self.previous is not None:
            parts.append(f"workload changed since {self.previous.date}: {self.difference}; not compared as a "
                         "regression")
        if b is not None and self.change is not None:
            parts.append(f"no regression: {n.tokens_per_s or 0:,.0f} tok/s vs {b.tokens_per_s:,.0f} tok/s on "
                         f"{b.date} ({self.change:+.1%}, threshold -{self.threshold:.0%})")
        elif b is None and not parts:
            parts.append("first night on this deployment: nothing to compare with yet")
        elif b is None:
            parts.append("no earlier night with this workload")
        return "; ".join(parts)


def compare(night: Night, history: list[Night], threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    """Tonight against the latest earlier night of the same workload (shape, size and load,
    :func:`workload_difference`); a drop of more than ``threshold`` is a regression. A night
    with no feasible configuration counts as 0 tok/s; an earlier night with none is no baseline."""
    if not 0 < threshold < 1:
        raise InputError(f"--threshold must be between 0 and 100%, got {threshold:.0%}")
    earlier = [n for n in history if n.started_at < night.started_at]
    previous = earlier[-1] if earlier else None
    same = [n for n in earlier if workload_difference(n, night) is None and n.tokens_per_s]
    baseline = same[-1] if same else None
    change = None
    if baseline is not None:
        change = (night.tokens_per_s or 0.0) / baseline.tokens_per_s - 1.0
    difference = workload_difference(previous, night) if previous is not None else None
    return Verdict(
        night=night, previous=previous, baseline=baseline, change=change, threshold=threshold,
        workload_changed=difference is not None, regression=change is not None and change < -threshold,
        difference=difference,
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

    if trials < 1:
        raise InputError(f"--trials must be >= 1, got {trials}")
    check_seed(seed)  # before the study is opened: bad input writes nothing
    t0 = time.perf_counter()
    name = study or nightly_study_name(space.deployment, space.name, backend if isinstance(backend, str) else backend.name)  # noqa: E501
    backend_obj = backend_for(backend, name, backend_options, space.workload.slo)
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

    return is_feasible(trial)


__all__ = ["DEFAULT_THRESHOLD", "LIKE_FACTOR", "NIGHTS_ATTR", "REGRESSION_EXIT", "Night", "NightlyOutcome", "RegressionDetected",  # noqa: E501
           "Verdict",
           "compare", "latest_window", "nightly_study_name", "nights", "run_nightly", "workload_difference",
           "workload_shape", "write_nightly_report"]

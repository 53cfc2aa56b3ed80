"""A study's tables as files for pandas and spreadsheets (``tuner export``).

* ``trials`` — :func:`tuner.study.analysis.trials_frame`: one row per trial, every trial, the
  configuration, every percentile measured, why a trial did not count.
* ``plan`` — every load sweep ``tuner plan`` stored in the study
  (:func:`tuner.study.analysis.plan_sweep`), one row per run, with the plan each belongs to.

CSV and JSON (a list of row objects) always; Parquet when pyarrow is installed
(``pip install pyarrow``). Each trial row has tuner's columns (seconds: ``ttft_p95_s``) and
the same measurement under ``vllm bench serve``'s names (:data:`tuner.serving.result.BENCH_FIELDS`:
``total_token_throughput``, ``p95_ttft_ms``, ``max_concurrency``, ...), so analysis code
written for ``vllm bench serve --save-result`` files reads it. Text is masked
as in every output of tuner (credentials in URLs, API keys): a file can be shared.
"""
from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.core.files import write_atomic
from tuner.core.urls import redact
from tuner.plan import list_plans
from tuner.report.html import default_report_dir
from tuner.study.analysis import SLO_COLUMNS, SWEEP_COLUMNS, plan_sweep, trials_frame

if TYPE_CHECKING:
    import optuna
    import pandas as pd

#: What can be exported.
TABLES = ("trials", "plan")
#: Columns that name the plan a sweep row belongs to (first in the ``plan`` table).
PLAN_KEY_COLUMNS = ("plan", "trial", "target_ttft_s", "max_load", "bound", "load_kind")


def formats() -> tuple[str, ...]:
    """``csv``, ``json`` (a list of row objects), and ``parquet`` when pandas can write it
    here (pyarrow installed)."""
    return ("csv", "json") + (("parquet",) if importlib.util.find_spec("pyarrow") is not None else ())


def plan_sweeps(study: optuna.Study) -> pd.DataFrame:
    """Every stored plan's sweep, oldest plan first; the columns of
    :data:`PLAN_KEY_COLUMNS` say which plan each row is of. Empty (same columns) when
    the study holds no plan."""
    import pandas as pd

    frames = []
    for key, est in sorted(list_plans(study).items(), key=lambda kv: kv[1].created):
        sweep = plan_sweep(study, trial=est.trial, target_ttft_s=est.target_ttft_s)
        keys = {"plan": key, "trial": est.trial, "target_ttft_s": est.target_ttft_s,
                "max_load": sweep.max_load, "bound": sweep.bound, "load_kind": sweep.load_kind}
        extra = [c for c in SLO_COLUMNS if c in sweep.frame.columns]  # a plan with SLOs besides P95 TTFT
        frames.append(sweep.frame.assign(**keys)[[*PLAN_KEY_COLUMNS, *SWEEP_COLUMNS, *extra]])
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in (*PLAN_KEY_COLUMNS, *SWEEP_COLUMNS)})
    return pd.concat(frames, ignore_index=True)


def table(study: optuna.Study, what: str = "trials") -> pd.DataFrame:
    """The table ``what`` (one of :data:`TABLES`) of ``study``, every text cell masked."""

    if what not in TABLES:
        raise InputError(f"cannot export {what!r}", hint=f"choose one of {', '.join(TABLES)}")
    frame = trials_frame(study).frame if what == "trials" else plan_sweeps(study)
    for column in frame.columns:  # a last pass, as report.html has: no credential leaves in a file
        if frame[column].dtype == object or str(frame[column].dtype) in ("str", "string"):
            frame[column] = frame[column].map(lambda v: redact(v) if isinstance(v, str) else v)
    return frame


def to_bytes(frame: pd.DataFrame, fmt: str = "csv") -> bytes:
    """``frame`` as a CSV (UTF-8, a header row, no index; ``pandas.read_csv`` reads it
    back), JSON (a list of row objects, ISO dates; ``pandas.read_json``) or Parquet file's bytes."""
    if fmt not in formats():
        hint = "pip install pyarrow" if fmt == "parquet" else f"choose one of {', '.join(formats())}"
        raise InputError(f"cannot write {fmt!r} here", hint=hint)
    if fmt == "csv":
        return frame.to_csv(index=False).encode("utf-8")
    if fmt == "json":  # pandas.read_json(path) reads it back: one object per row, NaN as null
        return frame.to_json(orient="records", date_format="iso", indent=1).encode("utf-8")
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def default_path(study: optuna.Study, what: str, fmt: str) -> Path:
    """``studies/<study>/<what>.<fmt>``, beside the study's report."""

    return default_report_dir(study) / f"{what}.{fmt}"


def export(study: optuna.Study, what: str = "trials", fmt: str = "csv", path: str | Path | None = None) -> Path:
    """Write the table ``what`` of ``study`` to ``path`` (default :func:`default_path`),
    whole or not at all; returns the path."""

    data = to_bytes(table(study, what), fmt)
    target = Path(path) if path is not None else default_path(study, what, fmt)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(target, data)


__all__ = ["PLAN_KEY_COLUMNS", "TABLES", "default_path", "export", "formats", "plan_sweeps", "table", "to_bytes"]

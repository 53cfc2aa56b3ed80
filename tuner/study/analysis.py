"""Read a finished (or running) study as tables: the API that the notebooks, the plots
and ``tuner report`` share.

* :func:`open_study` — a study from a ``.db`` file, a storage URL or a study name.
* :func:`trials_frame` — one row per trial, every trial (feasible, infeasible, refused
  by vLLM, failed, pruned, running), the configuration flattened into columns, every
  measured metric a column, and why a trial did not count (``reason``).
* :func:`best_trial` — the feasible trial with the most throughput.
* :func:`plan_sweep` — the load sweep ``tuner plan`` stored in the study, as a table.
* :func:`pareto_mask` — the trials no other trial beats on both throughput and P95 TTFT.
* :func:`top_groups` — the best feasible configurations, trials that differ only in knobs
  without effect on the study's workload (:mod:`tuner.study.effective`) counted as one.

The tables come as small typed results (:mod:`tuner.study.tables`): ``result.frame`` is a
plain DataFrame, and what the whole table means is a field (``TrialsTable.recommended``,
``TopGroups.caveat``, ``PlanSweep.max_load``), never ``DataFrame.attrs``.

Everything here reads only; the study stays an ordinary Optuna study that
``optuna.load_study`` and optuna-dashboard open (``optuna-dashboard sqlite:///studies/NAME.db``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.core.urls import redact, redact_value
from tuner.serving.capacity import stored_plan
from tuner.serving.config import ServeConfig
from tuner.serving.result import bench_fields, describe_errors
from tuner.serving.slo import SloSet
from tuner.study import Recommendation, best_feasible_trial, load_study_by_name, own_studies
from tuner.study import recommendation as study_recommendation
from tuner.study.effective import ANY, caveat, trial_group
from tuner.study.record import StudyRecord, TrialRecord
from tuner.study.storage import opened, storage_of
from tuner.study.tables import PlanSweep, Table, TopGroups, TrialsTable, as_frame

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from optuna.trial import FrozenTrial

#: Trial statuses in :func:`trials_frame` (column ``status``), in plotting order.
STATUSES = ("feasible", "infeasible", "refused", "failed", "pruned", "running")
#: Columns every :func:`trials_frame` has, whatever the study holds.
BASE_COLUMNS = ("number", "state", "status", "feasible", "value", "constraint", "reason", "errors", "layout",
                "tensor_parallel_size", "replicas", "tokens_per_s", "ttft_p95_s", "repeat_of",
                "datetime_start", "duration_s", "group", "folded")
#: Plan facts of the memory planner worth a column (``plan_<name>``).
PLAN_FACTS = ("kv_cache_tokens", "num_gpu_blocks", "max_concurrency", "weight_bytes", "kv_bytes", "startup_s")


def open_study(path_or_name: str | Path, storage: str | None = None) -> optuna.Study:
    """Load an existing study, read only in spirit (nothing is written).

    ``path_or_name`` is a SQLite file (``studies/NAME.db``; its only study, or the study
    named like the file when it holds several), a storage URL (``sqlite:///x.db``,
    ``postgresql://...``; its only study), or a study name (in ``storage`` when given, else
    ``studies/NAME.db``). :class:`~tuner.core.errors.InputError` names what exists otherwise.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    text = str(path_or_name)
    if storage is not None:
        return load_study_by_name(text, storage)
    if "://" in text:
        return _only_study(text, text, prefer=None)
    path = Path(text).expanduser()
    if path.suffix == ".db" or path.is_file():
        if not path.is_file():
            raise InputError(f"no study file {path}", hint="give a studies/NAME.db file or a study name "
                             "(tuner studies lists them)")
        return _only_study(f"sqlite:///{path.resolve()}", str(path), prefer=path.stem)
    return load_study_by_name(text)


def _only_study(url: str, where: str, prefer: str | None) -> optuna.Study:
    import optuna

    try:
        names = own_studies(optuna.get_all_study_names(url))
    except Exception as err:  # not a database, bad URL, missing driver
        raise InputError(f"cannot read studies from {where}: {type(err).__name__}: {err}".splitlines()[0],
                         hint="give a .db file written by tuner search, or an SQLAlchemy URL") from err
    if prefer in names:
        name = prefer
    elif len(names) == 1:
        name = names[0]
    else:
        raise InputError(f"{where} holds {len(names)} studies ({', '.join(names) or 'none'})",
                         hint="pass the study name and --storage with the URL")

    store = optuna.storages.RDBStorage(url)  # what optuna.load_study makes of the URL, kept as the study's handle
    return opened(optuna.load_study(study_name=name, storage=store), store)


def study_location(study: optuna.Study) -> Path | None:
    """The SQLite file behind ``study``, or ``None`` (another database, in memory)."""

    url = str(getattr(storage_of(study), "url", "") or "")  # an RDBStorage's URL (None: not opened by tuner)
    if url.startswith("sqlite:///") and not url.endswith(":memory:"):
        return Path(url.removeprefix("sqlite:///"))
    return None


def target_ttft_s(study: optuna.Study) -> float | None:
    """The study's P95 TTFT target in seconds (stamped by ``tuner search``)."""
    target = StudyRecord.from_study(study).target_ttft_s
    if target is None:  # older studies: each trial carries it
        for t in study.get_trials(deepcopy=False):
            rec = TrialRecord.from_trial(t)
            if rec.target_ttft_s is not None:
                return float(rec.target_ttft_s)
        return None
    return float(target)


def recommendation(study: optuna.Study) -> Recommendation | None:
    """What the study recommends (:class:`tuner.study.Recommendation`: the trial, its own
    measurement and the confirmed mean over its repeats), as ``tuner studies show`` and the
    report tell it; ``None`` when nothing met the target."""
    return study_recommendation(study)


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The feasible trial with the most tokens/s (ties: the earlier); ``None`` when no
    trial met the target."""
    return best_feasible_trial(study)


def _status(trial: FrozenTrial, rec: TrialRecord) -> str:
    from optuna.trial import TrialState

    if trial.state == TrialState.COMPLETE:
        if rec.feasible:
            return "feasible"
        return "refused" if rec.rejected_kind else "infeasible"
    return {TrialState.FAIL: "failed", TrialState.PRUNED: "pruned"}.get(trial.state, "running")


def _reason(trial: FrozenTrial, rec: TrialRecord, status: str) -> str | None:
    text = _why(trial, rec, status)
    return None if text is None else redact(text)  # a study written before redaction may hold a key


def _why(trial: FrozenTrial, rec: TrialRecord, status: str) -> str | None:
    if status in ("infeasible", "refused"):
        return str(rec.infeasible_reason or "did not meet the target")
    if status == "failed":
        return str(rec.error or "the trial raised (see the search log)")
    if status == "pruned":
        return str(rec.pruned_reason or "pruned by the sampler or a callback")
    if status == "running":
        return f"still {trial.state.name.lower()} (or its process was killed)"
    return None


def _number(value: Any) -> Any:
    return math.nan if value is None else value


def _folded(rec: TrialRecord, status: str) -> tuple[str | None, dict[str, str]]:
    """The trial's group key and its folded knobs with why (:mod:`tuner.study.effective`)."""

    return trial_group(rec, started=status in ("feasible", "infeasible"))  # measured, so vLLM started


def trial_row(trial: FrozenTrial) -> dict[str, Any]:
    """One :func:`trials_frame` row: base columns, then the configuration's knobs, the
    summary of the chosen load point (every percentile, in seconds), the same under
    ``vllm bench serve``'s names (:data:`tuner.serving.result.BENCH_FIELDS`, in ms), ``server_*``
    readings and ``plan_*`` memory-planner facts."""
    rec = TrialRecord.from_trial(trial)
    status = _status(trial, rec)
    config = rec.config.to_dict() if rec.config is not None else {}
    group, folded = _folded(rec, status)
    tp = config.get("tensor_parallel_size") or 1
    replicas = config.get("replicas") or 1
    duration = trial.duration.total_seconds() if trial.duration is not None else math.nan
    row: dict[str, Any] = {
        "number": trial.number, "state": trial.state.name, "status": status,
        # an infeasible trial scores 0 (a verdict near the target told the sampler what it served at its
        # lowest load instead: tuner.search.verdict; that stays in its record)
        "feasible": status == "feasible", "value": 0.0 if status == "infeasible" else _number(trial.value),
        "constraint": _number(rec.constraint), "reason": _reason(trial, rec, status),
        "errors": describe_errors(rec.errors, limit=8) or None,
        "layout": f"tp{tp}x{replicas}", "tensor_parallel_size": tp, "replicas": replicas,
        "repeat_of": _number(rec.repeat_of),
        "datetime_start": trial.datetime_start, "duration_s": duration,
        "group": group, "folded": "; ".join(f"{k}: {why}" for k, why in folded.items()) or None,
    }
    for key, value in config.items():
        row[key] = value
    for key, value in rec.summary.items():
        row[key] = _number(value)
    # What the trial measured at its chosen load (at its lowest load when infeasible,
    # where the objective ``value`` stays 0); nothing for a configuration never run.
    row.setdefault("tokens_per_s", math.nan)
    row.setdefault("ttft_p95_s", math.nan)
    for key, value in bench_fields(rec.summary, rec.chosen_load or rec.lowest_load).items():
        row[key] = _number(value)  # vllm bench serve's names: ms, req/s, tok/s, the load as a number
    for key in ("chosen_load", "lowest_load", "p95_ttft_at_lowest_load_s", "gpu_s", "rejected_kind",
                "rejected_at", "failed_by", "binding_slo"):
        if getattr(rec, key) is not None:
            row[key] = getattr(rec, key)
    row["n_loads"] = len(rec.loads)
    for key, value in rec.server.items():
        row[f"server_{key}"] = _number(redact_value(value))
    for key in PLAN_FACTS:
        if key in rec.run.plan:
            row[f"plan_{key}"] = _number(rec.run.plan[key])
    return row


def trials_frame(study: optuna.Study) -> TrialsTable:
    """Every trial of ``study`` as a row (see :func:`trial_row`), by trial number, in the
    :attr:`~tuner.study.tables.Table.frame` of a :class:`~tuner.study.tables.TrialsTable`
    (with the study's ``target_ttft_s`` and the ``recommended`` trial's number).

    ``status`` is one of :data:`STATUSES`; ``reason`` says why a trial did not count
    (vLLM's refusal, the TTFT miss with its numbers, the requests that failed, the crash);
    ``group`` names the trial's effective configuration (equal for trials that differ only in
    knobs without effect on the workload) and ``folded`` those knobs with why (``None``: none);
    ``errors`` the failed requests per kind at the trial's chosen (or lowest) load
    (``http_429 x400, timeout x3``; the counts are also columns ``errors_<kind>``, with the
    summary); credentials in any text are masked; ``value`` is the
    objective (0 for infeasible trials) while ``tokens_per_s`` / ``ttft_p95_s`` are what
    the trial measured at its chosen load (at its lowest load when infeasible).
    ``recommended`` marks the study's recommendation (:func:`recommendation`; its number is
    the table's ``recommended``, None when it has none). The rows are the study's
    configurations: the confirmation's repeats live in its companion study (those a study
    written before kept among its trials are left out too: :func:`tuner.study.repeats`).
    """
    import pandas as pd

    rows = [trial_row(t) for t in study.get_trials(deepcopy=False)
            if not TrialRecord.from_trial(t).is_confirmation]  # a repeat a study written before kept inside
    frame = pd.DataFrame(rows)
    for col in BASE_COLUMNS:
        if col not in frame.columns:
            frame[col] = pd.Series(dtype=object)
    if len(frame):
        frame = frame.sort_values("number").reset_index(drop=True)
    rec = study_recommendation(study)
    chosen = None if rec is None else rec.trial
    frame["recommended"] = (frame["number"] == chosen).astype(bool)
    return TrialsTable(frame, study.study_name, target_ttft_s=target_ttft_s(study), recommended=chosen)


def pareto_mask(frame: pd.DataFrame | TrialsTable, x: str = "ttft_p95_s", y: str = "tokens_per_s") -> pd.Series:
    """Rows on the Pareto front of low ``x`` and high ``y``: no other row has ``x`` <= and
    ``y`` >= with one strictly better. Rows with NaN in either are never on it; repeated
    configurations (``repeat_of``) are left to their first trial. ``frame``: a DataFrame of
    trials or a :func:`trials_frame`."""
    import pandas as pd

    frame = as_frame(frame)
    mask = pd.Series(False, index=frame.index)
    ok = frame[x].notna() & frame[y].notna()
    if "repeat_of" in frame.columns:
        ok &= frame["repeat_of"].isna()
    sub = frame.loc[ok, [x, y]].astype(float).sort_values([x, y], ascending=[True, False])
    best_y = -math.inf
    for idx, (_, yv) in sub.iterrows():
        if yv > best_y:
            mask[idx] = True
            best_y = yv
    return mask


#: Columns every :func:`top_groups` has, then one per knob of the configuration.
GROUP_COLUMNS = ("number", "trials", "missed", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max",
                 "ttft_p95_s", "chosen_load", "errors", "layout", "folded", "members", "group")


def top_groups(study: optuna.Study, n: int = 10, *, frame: pd.DataFrame | TrialsTable | None = None) -> TopGroups:
    """The ``n`` best effective configurations among the feasible trials, one row each, by
    throughput: trials whose configurations differ only in knobs without effect on this
    study's workload (``group`` of :func:`trials_frame`) are one configuration.

    ``number``, ``tokens_per_s``, ``ttft_p95_s``, ``chosen_load`` and ``errors`` are the
    group's best trial's; ``trials`` counts its feasible trials (``members``, their
    numbers) and ``missed`` the trials of the same configuration that ran but missed the
    target; ``tokens_per_s_min`` / ``_max`` is the spread of its feasible trials (noise
    between repeats, or what the folded knobs did after all). The knob columns hold the
    best trial's values, a folded knob ``any (why)``; ``folded`` lists them with why.
    ``frame`` reuses a :func:`trials_frame` of ``study``. The result's ``caveat`` says
    when the configurations were never applied (an endpoint study), else ``None``."""
    import dataclasses

    import pandas as pd

    frame = trials_frame(study).frame if frame is None else as_frame(frame)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    knobs = [f.name for f in dataclasses.fields(ServeConfig) if f.name in frame.columns]
    ok = frame["feasible"].astype(bool) & frame["group"].notna() if len(frame) else frame["number"].notna()
    feasible = frame[ok]
    missed = frame.loc[frame["status"] == "infeasible", "group"].value_counts() if len(frame) else {}
    rows = []
    for key, members in feasible.groupby("group", sort=False):
        members = members.sort_values(["tokens_per_s", "number"], ascending=[False, True])
        best = members.iloc[0]
        folded = _folded(TrialRecord.from_trial(trials[int(best["number"])]), "feasible")[1]
        row = {"number": int(best["number"]), "trials": len(members), "missed": int(missed.get(key, 0)),
               "tokens_per_s": best["tokens_per_s"], "tokens_per_s_min": members["tokens_per_s"].min(),
               "tokens_per_s_max": members["tokens_per_s"].max(), "ttft_p95_s": best["ttft_p95_s"],
               "chosen_load": best.get("chosen_load"), "errors": best["errors"], "layout": best["layout"],
               "folded": best["folded"], "members": tuple(int(m) for m in sorted(members["number"])),
               "group": key}
        for knob in knobs:
            row[knob] = f"{ANY} ({folded[knob]})" if knob in folded else best[knob]
        rows.append(row)
    out = pd.DataFrame(rows, columns=[*GROUP_COLUMNS, *knobs])
    if len(out):
        out = out.sort_values(["tokens_per_s", "number"], ascending=[False, True]).head(n).reset_index(drop=True)
    runs = [TrialRecord.from_trial(t).run.to_dict() for t in study.get_trials(deepcopy=False)]
    return TopGroups(out, study.study_name, caveat=next((c for c in map(caveat, runs) if c), None))


#: Columns of :func:`plan_sweep`.
SWEEP_COLUMNS = ("level", "load", "role", "repeat", "ttft_mean_s", "ttft_p95_s", "tpot_mean_s",
                 "e2e_mean_s", "e2e_p95_s", "tokens_per_s", "output_tokens_per_s", "requests_per_s",
                 "error_rate", "requests", "duration_s", "seed", "meets")
#: Columns :func:`plan_sweep` adds for a plan with SLOs besides P95 TTFT: requests/s meeting
#: every SLO, the SLO that limits the load, and its measured / bound.
SLO_COLUMNS = ("goodput_requests_per_s", "binding_slo", "slo_ratio")


def plan_sweep(study: optuna.Study, *, trial: int | None = None,
               target_ttft_s: float | str | None = None) -> PlanSweep:
    """The load sweep of the newest capacity plan ``tuner plan`` stored in ``study`` (for
    ``trial`` / ``target_ttft_s`` when given), one row per run, by load; ``meets`` says
    whether the run met the plan's target. Empty (same columns) when the study holds no
    plan. The :class:`~tuner.study.tables.PlanSweep` carries the plan's ``target_ttft_s``,
    ``max_load``, ``bound``, ``load_kind``, ``trial``, ``tokens_per_s``, ``max_concurrency``
    and (for a plan of several SLOs) ``slos``, the set as typed, P95 TTFT first; its ``plan``
    is ``None`` when the study holds no plan."""
    import pandas as pd

    est = stored_plan(study, trial=trial, target_ttft_s=target_ttft_s)
    if est is None:
        return PlanSweep(pd.DataFrame({c: pd.Series(dtype=object) for c in SWEEP_COLUMNS}), study.study_name)
    rows = []
    for p in sorted(est.sweep, key=lambda p: (p.repeat, p.level, p.role)):
        row = p.to_dict()
        row["meets"] = p.meets(est.target_ttft_s)
        rows.append({k: _number(v) if k not in ("load", "role", "binding_slo") else v for k, v in row.items()})
    frame = pd.DataFrame(rows, columns=list(SWEEP_COLUMNS) + list(SLO_COLUMNS if est.slos else ()))
    return PlanSweep(
        frame, study.study_name, plan=f"trial {est.trial} at {est.target_ttft_s:g} s", trial=est.trial,
        target_ttft_s=est.target_ttft_s, max_load=est.max_load, bound=est.bound, load_kind=est.load_kind,
        tokens_per_s=est.tokens_per_s, max_concurrency=est.max_concurrency,
        slos=SloSet.of((f"p95:ttft<={est.target_ttft_s}s", *est.slos)).texts if est.slos else (),
    )


__all__ = [
    "BASE_COLUMNS", "GROUP_COLUMNS", "SLO_COLUMNS", "STATUSES", "SWEEP_COLUMNS", "PlanSweep", "Table", "TopGroups",
    "TrialsTable", "best_trial", "open_study", "pareto_mask", "plan_sweep", "recommendation", "study_location",
    "target_ttft_s", "top_groups", "trial_row", "trials_frame",
]

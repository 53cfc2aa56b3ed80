from __future__ import annotations

import json
import math
import sqlite3

import optuna
import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from sim_study import STUDY, TARGET_S, sim_study_db  # noqa: F401  (session fixture)

from tuner.analysis import (
    BASE_COLUMNS,
    best_trial,
    open_study,
    pareto_mask,
    plan_sweep,
    study_location,
    trials_frame,
)
from tuner.errors import InputError
from tuner.study import trial_config

pytestmark = pytest.mark.slow  # the shared simulator study takes ~10-20 s to build once


def test_open_study_by_file_url_and_name(sim_study_db, monkeypatch):
    by_file = open_study(sim_study_db)
    assert by_file.study_name == STUDY
    assert study_location(by_file) == sim_study_db.resolve()
    by_url = open_study(f"sqlite:///{sim_study_db}")
    by_name = open_study(STUDY, storage=f"sqlite:///{sim_study_db}")
    assert len(by_file.trials) == len(by_url.trials) == len(by_name.trials)
    monkeypatch.chdir(sim_study_db.parent.parent)  # tuner's default: studies/<name>.db
    (sim_study_db.parent.parent / "studies").mkdir(exist_ok=True)
    copy = sqlite3.connect(sim_study_db.parent.parent / "studies" / f"{STUDY}.db")
    with sqlite3.connect(sim_study_db) as source:  # the backup API also copies the WAL's pages
        source.backup(copy)
    copy.close()
    assert open_study(STUDY).study_name == STUDY


def test_open_study_errors_name_what_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="no study file"):
        open_study(tmp_path / "missing.db")
    with pytest.raises(InputError, match="no study 'nope'"):
        open_study("nope")
    url = f"sqlite:///{tmp_path / 'two.db'}"
    for name in ("a", "b"):
        optuna.create_study(study_name=name, storage=url)
    with pytest.raises(InputError, match=r"holds 2 studies \(a, b\)"):
        open_study(tmp_path / "two.db")
    (tmp_path / "junk.db").write_text("not a database")
    with pytest.raises(InputError, match="cannot read studies"):
        open_study(tmp_path / "junk.db")


def test_trials_frame_has_every_trial_its_config_and_metrics(sim_study_db):
    study = open_study(sim_study_db)
    frame = trials_frame(study)
    assert list(frame["number"]) == [t.number for t in study.trials]
    assert set(BASE_COLUMNS) <= set(frame.columns)
    for trial in study.trials:
        row = frame.loc[frame["number"] == trial.number].iloc[0]
        config = trial_config(trial)
        assert row["layout"] == f"tp{config.tensor_parallel_size}x{config.replicas}"
        for knob, value in config.to_dict().items():
            assert row[knob] == value or (value is None and pd.isna(row[knob]))
        for metric in trial.user_attrs.get("summary") or {}:
            assert metric in frame.columns
    feasible = frame[frame["feasible"]]
    assert len(feasible) and (feasible["ttft_p95_s"] <= TARGET_S).all()
    assert (feasible["value"] == feasible["tokens_per_s"]).all()
    assert feasible["reason"].isna().all()
    others = frame[~frame["feasible"]]
    assert others["reason"].notna().all()
    refused = frame[frame["status"] == "refused"]
    assert refused["tokens_per_s"].isna().all()  # never measured, not "0 tokens/s"
    assert frame.attrs["target_ttft_s"] == TARGET_S


def test_failed_pruned_and_running_trials_are_rows_with_reasons():
    study = optuna.create_study(direction="maximize")
    dist = {"layout": CategoricalDistribution(["tp1x1"])}
    config = {"tensor_parallel_size": 1, "replicas": 1, "max_num_seqs": 64}
    study.add_trial(create_trial(state=TrialState.FAIL, params={"layout": "tp1x1"}, distributions=dist,
                                 user_attrs={"config": config, "error": "BackendError: server died"}))
    study.add_trial(create_trial(state=TrialState.PRUNED, params={"layout": "tp1x1"}, distributions=dist,
                                 user_attrs={"config": config}))
    study.add_trial(create_trial(state=TrialState.RUNNING, params={"layout": "tp1x1"}, distributions=dist))
    study.add_trial(create_trial(value=0.0, params={"layout": "tp1x1"}, distributions=dist, user_attrs={
        "config": config, "feasible": False, "infeasible_reason": "P95 TTFT 9 s over the 2 s target even at 1 users",
        "summary": {"ttft_p95_s": 9.0, "tokens_per_s": 120.0}}))
    frame = trials_frame(study)
    assert list(frame["status"]) == ["failed", "pruned", "running", "infeasible"]
    assert frame.loc[0, "reason"] == "BackendError: server died"
    assert "pruned" in frame.loc[1, "reason"] and "running" in frame.loc[2, "reason"]
    # an infeasible trial keeps what it measured; its objective stays 0
    assert frame.loc[3, "value"] == 0.0 and frame.loc[3, "tokens_per_s"] == 120.0
    assert best_trial(study) is None


def test_trials_frame_of_an_empty_study_has_the_columns():
    frame = trials_frame(optuna.create_study())
    assert frame.empty and set(BASE_COLUMNS) <= set(frame.columns)


def test_best_trial_is_the_fastest_feasible(sim_study_db):
    study = open_study(sim_study_db)
    frame = trials_frame(study)
    best = best_trial(study)
    assert best is not None and best.user_attrs["feasible"]
    assert best.value == frame.loc[frame["feasible"], "tokens_per_s"].max()


def test_pareto_mask_hand_worked():
    frame = pd.DataFrame({
        "ttft_p95_s": [0.5, 1.0, 0.7, 2.0, 0.5, math.nan, 1.5],
        "tokens_per_s": [100, 300, 80, 300, 90, 999, 400],
        "repeat_of": [math.nan] * 6 + [math.nan],
    })
    # 0 (fastest TTFT), 1 (more tok/s at 1.0 s), 6 (most tok/s); 2 and 4 lose to 0,
    # 3 loses to 1 (same tok/s, slower), 5 has no TTFT
    assert list(pareto_mask(frame)) == [True, True, False, False, False, False, True]
    frame.loc[6, "repeat_of"] = 1  # a repeat never counts twice
    assert list(pareto_mask(frame)) == [True, True, False, False, False, False, False]


def test_plan_sweep_is_the_stored_plan(sim_study_db):
    study = open_study(sim_study_db)
    sweep = plan_sweep(study)
    assert len(sweep) >= 3
    assert sweep.attrs["target_ttft_s"] == TARGET_S
    assert list(sweep["meets"]) == [bool(p <= TARGET_S) for p in sweep["ttft_p95_s"]]
    # the capacity lies between the loads that met the target and the first that did not
    met = sweep.loc[sweep["meets"], "level"]
    missed = sweep.loc[~sweep["meets"], "level"]
    assert met.max() <= sweep.attrs["max_load"] + 1e-9
    if len(missed) and sweep.attrs["bound"] == "interpolated":
        assert sweep.attrs["max_load"] < missed.min()


def test_plan_sweep_without_a_plan_is_empty():
    sweep = plan_sweep(optuna.create_study())
    assert sweep.empty and "ttft_p95_s" in sweep.columns and sweep.attrs["plan"] is None


def test_the_study_stays_readable_by_plain_optuna(sim_study_db):
    """optuna.load_study (and so optuna-dashboard) opens it with a plain URL; every user
    attr is strict JSON (no NaN, no Python objects)."""
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{sim_study_db}")
    assert len(study.trials) >= 10
    json.dumps(study.user_attrs, allow_nan=False)
    for trial in study.trials:
        json.dumps(trial.user_attrs, allow_nan=False)
        json.dumps(trial.params, allow_nan=False)
    assert any(k.startswith("plan/") for k in study.user_attrs)


def _errors_study(storage: str | None = None) -> optuna.Study:
    """One trial that errors failed, one feasible with a few failures, and a crash whose
    message (written before redaction existed) names an endpoint with its key."""
    study = optuna.create_study(direction="maximize", storage=storage)
    dist = {"layout": CategoricalDistribution(["tp1x1"])}
    config = {"tensor_parallel_size": 1, "replicas": 1, "max_num_seqs": 64}
    study.add_trial(create_trial(value=0.0, params={"layout": "tp1x1"}, distributions=dist, user_attrs={
        "config": config, "feasible": False, "failed_by": "errors", "errors": {"http_429": 24},
        "infeasible_reason": "24 of 24 requests failed at 8 users: http_429 x24; at most 1% may fail",
        "loads": [{"load": "8 users", "errors": {"http_429": 24}}],
        "server": {"endpoints": ["http://me:sk-old-secret-1234@h:8000"]}}))
    study.add_trial(create_trial(value=900.0, params={"layout": "tp1x1"}, distributions=dist, user_attrs={
        "config": config, "feasible": True, "errors": {"timeout": 1}, "summary": {"ttft_p95_s": 0.5},
        "loads": [{"load": "4 users", "errors": {"timeout": 1}}, {"load": "8 users", "errors": {"timeout": 3}}]}))
    study.add_trial(create_trial(state=TrialState.FAIL, params={"layout": "tp1x1"}, distributions=dist,
                                 user_attrs={"config": config,
                                             "error": "BackendError: http://me:sk-old-secret-1234@h:8000 died"}))
    return study


def test_trials_frame_shows_the_error_kinds_beside_the_reason_and_masks_keys():
    from tuner.study import error_totals

    study = _errors_study()
    frame = trials_frame(study)
    assert list(frame["errors"])[:2] == ["http_429 x24", "timeout x1"] and pd.isna(frame.loc[2, "errors"])
    assert frame.loc[0, "failed_by"] == "errors" and "http_429 x24" in frame.loc[0, "reason"]
    assert "sk-old-secret" not in frame.to_csv() and "http://***@h:8000" in frame.loc[2, "reason"]
    assert error_totals(study) == {"http_429": 24, "timeout": 4}

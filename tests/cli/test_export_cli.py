"""tuner export: the trials frame and the stored plan sweeps as files pandas reads back."""
from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
from cli_runner import run_cli
from pg_db import pg_url  # noqa: F401  (fixture)
from sim_study import sim_study_db  # noqa: F401  (session fixture)

from tuner.study.analysis import open_study, plan_sweep, trials_frame


@pytest.mark.slow
def test_the_trials_round_trip_through_pandas(sim_study_db, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "trials.csv"
    code, text, err = run_cli(["export", str(sim_study_db), "--out", str(out)], capsys)
    assert code == 0, err
    frame = trials_frame(open_study(sim_study_db)).frame
    back = pd.read_csv(out)
    assert f"wrote {out} ({len(frame):,} trials)" in text
    assert list(back.columns) == list(frame.columns) and len(back) == len(frame)
    for column in ("number", "value", "tokens_per_s", "ttft_p95_s", "max_num_seqs", "gpu_memory_utilization"):
        assert back[column].tolist() == pytest.approx(frame[column].tolist(), nan_ok=True), column
    for column in ("status", "layout", "reason"):
        assert back[column].fillna("").tolist() == frame[column].fillna("").tolist(), column
    assert back["feasible"].tolist() == frame["feasible"].tolist()


@pytest.mark.slow
def test_the_plan_sweeps_name_their_plan(sim_study_db, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "plan.csv"
    code, _, err = run_cli(["export", str(sim_study_db), "--what", "plan", "--out", str(out)], capsys)
    assert code == 0, err
    back = pd.read_csv(out)
    sweep = plan_sweep(open_study(sim_study_db))
    assert len(back) == len(sweep) > 0
    assert set(back["trial"]) == {sweep.trial} and set(back["max_load"]) == {sweep.max_load}
    assert set(back["bound"]) == {sweep.bound} and set(back["load_kind"]) == {sweep.load_kind}
    assert back["level"].tolist() == pytest.approx(sweep.frame["level"].tolist())
    assert back["meets"].tolist() == sweep.frame["meets"].tolist()


def test_a_study_without_plans_exports_the_header_only(tmp_path, monkeypatch, capsys):
    from test_analysis import _errors_study

    _errors_study(f"sqlite:///{tmp_path}/e.db")
    code, text, err = run_cli(["export", f"sqlite:///{tmp_path}/e.db", "--what", "plan", "--out", "-"], capsys)
    assert code == 0, err
    header = text.splitlines()
    assert len(header) == 1 and header[0].startswith("plan,trial,target_ttft_s,")


def test_credentials_are_masked_in_the_file(tmp_path, capsys):
    from test_analysis import _errors_study

    _errors_study(f"sqlite:///{tmp_path}/e.db")
    out = tmp_path / "e.csv"
    code, _, err = run_cli(["export", f"sqlite:///{tmp_path}/e.db", "--out", str(out)], capsys)
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    assert "sk-old-secret" not in text and "http://***@h:8000" in text
    assert pd.read_csv(out)["errors"].tolist()[:2] == ["http_429 x24", "timeout x1"]


def test_csv_to_stdout(tmp_path, capsys):
    from test_analysis import _errors_study

    _errors_study(f"sqlite:///{tmp_path}/e.db")
    code, text, _ = run_cli(["export", f"sqlite:///{tmp_path}/e.db", "--out", "-"], capsys)
    assert code == 0 and text.startswith("number,state,status,") and len(text.splitlines()) == 4


def test_parquet_only_where_pyarrow_is(tmp_path, capsys):
    from test_analysis import _errors_study

    _errors_study(f"sqlite:///{tmp_path}/e.db")
    out = tmp_path / "e.parquet"
    code, _, err = run_cli(["export", f"sqlite:///{tmp_path}/e.db", "--format", "parquet", "--out", str(out)], capsys)
    if importlib.util.find_spec("pyarrow") is None:
        assert code == 2 and "'parquet' is not one of 'csv', 'json'" in err
    else:
        assert code == 0, err
        assert pd.read_parquet(out)["errors"].tolist()[:2] == ["http_429 x24", "timeout x1"]


def test_no_study_says_how_to_get_or_name_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for command in ("export", "report"):
        code, _, err = run_cli([command], capsys)
        assert code == 2 and err.count("\n") == 1
        assert "no study in studies/" in err and f"tuner {command} NAME" in err and "--gpu" not in err


@pytest.mark.postgres
def test_report_and_export_find_the_newest_study_in_a_server_database(pg_url, tmp_path, capsys):  # noqa: F811
    from test_analysis import _errors_study

    from tuner.study.locks import driver_url

    _errors_study(driver_url(pg_url))
    code, text, err = run_cli(["export", "--storage", pg_url, "--out", str(tmp_path / "t.csv")], capsys)
    assert code == 0, err
    assert len(pd.read_csv(tmp_path / "t.csv")) == 3
    code, text, err = run_cli(["report", "--storage", pg_url, "--out", str(tmp_path / "r")], capsys)
    assert code == 0, err
    assert (tmp_path / "r" / "report.html").is_file()


def _bench_study(storage: str):
    """One feasible trial whose chosen load (3 users) measured the hand-worked run of
    tests/test_result.py, and one at 2.5 req/s measured before std was kept (none)."""
    import numpy as np
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import create_trial
    from test_result import _run

    from tuner.core.jsonsafe import json_safe
    from tuner.serving.config import ServeConfig
    from tuner.study.record import TrialRecord

    study = optuna.create_study(direction="maximize", storage=storage)
    dist = {"layout": CategoricalDistribution(["tp1x1"])}
    summary = _run(itl_s=np.array([0.01, 0.03])).summary()
    old = {k: v for k, v in summary.items() if "_std_" not in k and not k.startswith("itl_")}
    for load, s in (("3 users", summary), ("2.5 req/s", old)):
        rec = TrialRecord(config=ServeConfig(max_num_seqs=64), feasible=True, summary=json_safe(s),
                          chosen_load=load, tokens_per_s=s["tokens_per_s"])
        study.add_trial(create_trial(value=s["tokens_per_s"], params={"layout": "tp1x1"}, distributions=dist,
                                     user_attrs=rec.to_attrs()))
    return study


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_pandas_reads_vllm_bench_columns_in_their_units(fmt, tmp_path, capsys):
    _bench_study(f"sqlite:///{tmp_path}/b.db")
    out = tmp_path / f"b.{fmt}"
    code, text, err = run_cli(["export", f"sqlite:///{tmp_path}/b.db", "--format", fmt, "--out", str(out)], capsys)
    assert code == 0, err
    assert f"({2:,} trials)" in text
    back = pd.read_csv(out) if fmt == "csv" else pd.read_json(out)
    new, old = back.iloc[0], back.iloc[1]
    # the hand-worked run: TTFT 100-400 ms, 444 tokens and 4 requests in 2 s, ITL 10 and 30 ms
    assert new["mean_ttft_ms"] == pytest.approx(250.0) and new["ttft_mean_s"] == pytest.approx(0.25)
    assert new["std_ttft_ms"] == pytest.approx(111.803, abs=1e-3) and new["median_ttft_ms"] == pytest.approx(250.0)
    assert new["total_token_throughput"] == pytest.approx(222.0) and new["output_throughput"] == pytest.approx(22.0)
    assert new["request_throughput"] == pytest.approx(2.0) and new["mean_itl_ms"] == pytest.approx(20.0)
    assert new["max_concurrency"] == 3 and pd.isna(new["request_rate"])
    assert old["request_rate"] == 2.5 and pd.isna(old["max_concurrency"])
    assert pd.isna(old["std_ttft_ms"]) and pd.isna(old["mean_itl_ms"])  # not stored: empty, not invented
    assert old["p95_ttft_ms"] == pytest.approx(1e3 * old["ttft_p95_s"])
    for column in ("max_concurrency", "request_rate", "p99_e2el_ms", "total_token_throughput"):
        assert pd.api.types.is_numeric_dtype(back[column]), column

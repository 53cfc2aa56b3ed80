"""Nightly runs: the comparison of nights (hand-worked), workload shapes and windows,
a slower deployment flagged as a regression (exit 4, named in the report), a changed
workload reported and not flagged, and the lock against a second run."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from pg_db import pg_url  # noqa: F401  (fixture)

from tuner.cli import main
from tuner.core.units import parse_seconds
from tuner.ops.nightly import Night, compare, latest_window, nights, parse_threshold, workload_shape
from tuner.study import load_study_by_name, repeats
from tuner.study.locks import StudyLock
from tuner.study.record import TrialRecord
from tuner.traffic import native
from tuner.traffic.workload import Workload

STUDY = "nightly-test"


def night(at: str, tok: float | None, shape: str = "p9.0/o8.0/r-", **kw) -> Night:
    return Night(started_at=at, date=at[:10], fingerprint="f" * 16, shape=shape, tokens_per_s=tok,
                 trial=None if tok is None else 1, config=None, new_trials=5, **kw)


def test_a_drop_beyond_the_threshold_on_the_same_shape_is_a_regression():
    history = [night("2026-01-01T02:00", 1000.0), night("2026-01-02T02:00", 1050.0)]
    v = compare(night("2026-01-03T02:00", 900.0), history, threshold=0.10)
    assert v.baseline is history[-1] and v.regression  # 900 / 1050 = -14.3%
    assert "REGRESSION" in v.headline and "-14.3%" in v.headline
    ok = compare(night("2026-01-03T02:00", 960.0), history, threshold=0.10)  # -8.6%
    assert not ok.regression and "no regression" in ok.headline
    none = compare(night("2026-01-03T02:00", None), history, threshold=0.10)  # nothing feasible tonight
    assert none.regression and none.change == -1.0


def test_a_changed_workload_is_reported_and_compared_only_with_its_own_shape():
    history = [night("2026-01-01T02:00", 1000.0, "p9.0/o8.0/r-", workload={"mean_prompt_tokens": 500}),
               night("2026-01-02T02:00", 2000.0, "p8.0/o8.0/r-", workload={"mean_prompt_tokens": 250})]
    v = compare(night("2026-01-03T02:00", 980.0, "p9.0/o8.0/r-", workload={"mean_prompt_tokens": 510}),
                history, threshold=0.10)
    assert v.workload_changed and not v.regression  # -51% against night 2, but that was other traffic
    assert v.baseline is history[0] and v.change == pytest.approx(-0.02)
    assert "workload changed" in v.headline and "250 -> 510" in v.headline
    first = compare(night("2026-01-03T02:00", 10.0, "p5.0/o5.0/r-"), history)
    assert first.baseline is None and not first.regression


def test_a_quiet_night_of_the_same_shape_is_another_workload_not_a_regression():
    """12 requests where last night had 200 (same shape): the study cannot offer the load it
    offered before, so its throughput falls with the traffic; the same size and a drop is
    still a regression."""
    busy = {"requests": 200, "span_s": 50.0}
    history = [night("2026-01-01T02:00", 16000.0, workload=busy)]
    quiet = compare(night("2026-01-02T02:00", 2400.0, workload={"requests": 12, "span_s": 3.0}), history)
    assert quiet.workload_changed and not quiet.regression and quiet.baseline is None
    assert "200 -> 12 requests" in quiet.headline and "not compared as a regression" in quiet.headline
    sparse = compare(night("2026-01-02T02:00", 2400.0, workload={"requests": 190, "span_s": 500.0}), history)
    assert sparse.workload_changed and "requests/s" in sparse.headline and not sparse.regression
    same = compare(night("2026-01-02T02:00", 12000.0, workload={"requests": 180, "span_s": 48.0}), history)
    assert not same.workload_changed and same.regression and same.baseline is history[0]


def test_parsers():
    assert parse_seconds("24h", what="w") == 86400 and parse_seconds("90m", what="w") == 5400
    assert parse_threshold("10%") == parse_threshold("0.1") == pytest.approx(0.1)
    for bad in ("0%", "150%", "x"):
        with pytest.raises(Exception, match="threshold"):
            parse_threshold(bad)


def _workload(prompt: float, n: int = 60, span_s: float = 0.0, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(arrival_s=np.linspace(0.0, span_s, n), prompt_tokens=rng.poisson(prompt, n) + 1,
                    output_tokens=rng.poisson(200, n) + 1, source="test")


def test_shape_holds_for_new_samples_of_one_mix_and_moves_with_longer_prompts():
    a, b = _workload(400, seed=1), _workload(400, seed=2)
    assert a.fingerprint() != b.fingerprint() and workload_shape(a) == workload_shape(b)
    assert workload_shape(_workload(1600)) != workload_shape(a)


def test_latest_window_keeps_the_last_day_of_a_two_day_log():
    w = _workload(400, n=49, span_s=48 * 3600.0)  # one request an hour
    day = latest_window(w, 24 * 3600)  # hours 24..48, both ends in
    assert len(day) == 25 and day.arrival_s[0] == 0.0
    assert np.array_equal(day.prompt_tokens, w.prompt_tokens[-25:])
    assert latest_window(w, 72 * 3600) is w  # a window longer than the log: all of it


def _trace(tmp_path, prompt: float = 400, name: str = "t.jsonl", span_s: float = 0.0):
    return str(native.write(_workload(prompt, span_s=span_s), tmp_path / name))


def _night(storage: str, trace: str, out, *extra: str) -> int:
    argv = ["nightly", "--trace", trace, "--trials", "4", "--storage", storage, "--study", STUDY,
            "--out", str(out), *extra]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
        raise SystemExit(0)
    return exit_info.value.code


@pytest.mark.postgres
@pytest.mark.slow
def test_a_slower_deployment_is_a_regression_named_in_the_report(tmp_path, pg_url, capsys):  # noqa: F811
    trace = _trace(tmp_path)
    slow = tmp_path / "slow.yaml"  # a deployment that lost over half its memory bandwidth and FLOP/s
    slow.write_text("hbm_efficiency: 0.35\nflops_efficiency: 0.3\n")
    assert _night(pg_url, trace, tmp_path / "n1") == 0
    code = _night(pg_url, trace, tmp_path / "n2", "--calibration", str(slow))
    err = capsys.readouterr().err
    assert code == 4, err
    stored = nights(load_study_by_name(STUDY, pg_url))
    assert len(stored) == 2 and stored[0].fingerprint == stored[1].fingerprint
    drop = stored[1].tokens_per_s / stored[0].tokens_per_s - 1
    assert drop < -0.10
    size = f"{drop:+.1%}"
    report = (tmp_path / "n2" / "nightly.md").read_text()
    assert "REGRESSION" in report and size in report
    assert "REGRESSION" in (tmp_path / "n2" / "nightly.html").read_text()
    assert json.loads((tmp_path / "n2" / "nightly.json").read_text())["change"] == pytest.approx(drop)
    assert [line for line in err.splitlines() if line.startswith("tuner:")] and size in err
    # last night's best configuration ran first tonight, on the slower deployment
    assert stored[1].rerun_of_previous is not None and stored[1].rerun_of_previous < stored[0].tokens_per_s


@pytest.mark.slow
def test_a_changed_workload_is_reported_not_flagged(tmp_path):
    storage = f"sqlite:///{tmp_path}/n.db"
    # long prompts, then short ones: fewer tokens per second (prefill tokens count), same deployment
    two_days = _trace(tmp_path, 2400, "long.jsonl", span_s=48 * 3600.0)  # 60 requests, one per 48/59 h
    assert _night(storage, two_days, tmp_path / "n1", "--window", "24h") == 0
    assert _night(storage, _trace(tmp_path, 300, "short.jsonl"), tmp_path / "n2") == 0
    report = (tmp_path / "n2" / "nightly.md").read_text()
    assert "workload changed" in report and "REGRESSION" not in report
    stored = nights(load_study_by_name(STUDY, storage))
    assert stored[0].workload["requests"] == 30  # requests 30..59 arrive in the last 24 h
    assert stored[1].tokens_per_s < 0.9 * stored[0].tokens_per_s  # it would have been flagged
    # --trials 4 is four trials of the budget each night; the winner's repeats are counted apart
    assert [n.new_trials for n in stored] == [4, 4]
    study = load_study_by_name(STUDY, storage)
    for n in stored:  # the study holds the nights' trials; its companion the repeats
        tonight = [r for r in map(TrialRecord.from_trial, study.trials) if r.tags.get("night") == n.started_at]
        confirmed = [r for r in map(TrialRecord.from_trial, repeats(study)) if r.tags.get("night") == n.started_at]
        assert len(tonight) == 4 and not any(r.is_confirmation for r in tonight)
        assert n.repeats == len(confirmed) and all(r.is_confirmation for r in confirmed)
    assert sum(n.repeats for n in stored) > 0  # the winner was confirmed: repeats existed to miscount


def test_a_second_nightly_run_on_a_sqlite_study_exits_with_a_clear_message(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/n.db"
    with StudyLock(storage, STUDY, "nightly") as lock:
        assert lock.acquire(blocking=False)
        assert _night(storage, _trace(tmp_path), tmp_path / "n") == 2
    err = capsys.readouterr().err
    assert "already running" in err and STUDY in err and f":{os.getpid()})" in err  # names the holder


@pytest.mark.postgres
def test_a_second_nightly_run_on_a_postgresql_study_exits_with_a_clear_message(tmp_path, pg_url, capsys):  # noqa: F811
    with StudyLock(pg_url, STUDY, "nightly") as lock:  # another run's advisory lock
        assert lock.acquire(blocking=False)
        assert _night(pg_url, _trace(tmp_path), tmp_path / "n") == 2
    err = capsys.readouterr().err
    assert "already running" in err and f":{os.getpid()})" in err


@pytest.mark.parametrize("extra, words", [
    (["--threshold", "150%"], "--threshold"),
    (["--timeout", "soon"], "--timeout"),
    (["--calibration", "missing.yaml"], "calibration"),
    (["--seed", "-1"], "--seed"),
])
def test_bad_nightly_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, extra, words):
    monkeypatch.chdir(tmp_path)
    assert _night(f"sqlite:///{tmp_path}/n.db", _trace(tmp_path), tmp_path / "n", *extra) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tuner:") and words in lines[0]
    assert not (tmp_path / "n.db").exists()  # refused before any study was opened

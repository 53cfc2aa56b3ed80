from __future__ import annotations

import json
import math
import re
import sqlite3

import optuna
import pandas as pd
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from sim_study import STUDY, TARGET_S, sim_study_db  # noqa: F401  (session fixture)

from tuner.core.errors import InputError
from tuner.plan import load_plan
from tuner.report.export import table
from tuner.study import recommendation, trial_config
from tuner.study.analysis import (
    BASE_COLUMNS,
    GROUP_COLUMNS,
    best_trial,
    open_study,
    pareto_mask,
    plan_sweep,
    study_location,
    top_groups,
    trials_frame,
)
from tuner.study.tables import PlanSweep, TopGroups, TrialsTable

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
    trials = trials_frame(study)
    frame = trials.frame
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
    assert trials.target_ttft_s == TARGET_S and trials.study == STUDY and len(trials) == len(study.trials)


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
    frame = trials_frame(study).frame
    assert list(frame["status"]) == ["failed", "pruned", "running", "infeasible"]
    assert frame.loc[0, "reason"] == "BackendError: server died"
    assert "pruned" in frame.loc[1, "reason"] and "running" in frame.loc[2, "reason"]
    # an infeasible trial keeps what it measured; its objective stays 0
    assert frame.loc[3, "value"] == 0.0 and frame.loc[3, "tokens_per_s"] == 120.0
    assert best_trial(study) is None


def test_trials_frame_of_an_empty_study_has_the_columns():
    trials = trials_frame(optuna.create_study())
    assert trials.empty and not len(trials) and set(BASE_COLUMNS) <= set(trials.frame.columns)
    assert trials.recommended is None and trials.target_ttft_s is None


def test_the_typed_results_are_the_only_carriers_of_what_a_table_means(sim_study_db):
    """No DataFrame tuner.study.analysis (or tuner export) hands out carries ``.attrs`` (untyped,
    lost in a file): the typed fields of the result say what the table means."""
    study = open_study(sim_study_db)
    results = {"trials": trials_frame(study), "top": top_groups(study), "sweep": plan_sweep(study),
               "no plan": plan_sweep(optuna.create_study())}
    assert [type(r) for r in results.values()] == [TrialsTable, TopGroups, PlanSweep, PlanSweep]
    frames = {name: r.frame for name, r in results.items()}
    frames |= {name: r.to_frame() for name, r in results.items()}
    frames |= {f"export {what}": table(study, what) for what in ("trials", "plan")}
    assert all(isinstance(f, pd.DataFrame) and len(f) for name, f in frames.items() if name != "no plan")
    assert {name: f.attrs for name, f in frames.items() if f.attrs} == {}


def test_a_notebook_reads_the_recommended_trial_and_sees_the_table(sim_study_db):
    study = open_study(sim_study_db)
    trials = trials_frame(study)  # as a notebook cell does
    chosen = trials.frame[trials.frame["recommended"]]
    assert list(chosen["number"]) == [trials.recommended] == [recommendation(study).trial]
    assert chosen["feasible"].item() and chosen["ttft_p95_s"].item() <= trials.target_ttft_s
    assert trials.frame.loc[trials.frame["number"] != trials.recommended, "recommended"].eq(False).all()
    # a cell ending in the result shows the table, under a line of what it means
    shown = trials._repr_html_()
    assert shown.count("<table") == 1 and f"trial {trials.recommended} recommended" in shown
    assert f"target P95 TTFT {TARGET_S:g} s" in shown and len(trials) == len(study.trials)
    assert repr(trials).splitlines()[0] == trials.describe()
    # to_frame is a copy to change; the result itself cannot be changed
    mine = trials.to_frame()
    mine["tokens_per_s"] = 0.0
    assert trials.frame["tokens_per_s"].max() > 0
    with pytest.raises(AttributeError):
        trials.recommended = 0  # type: ignore[misc]
    # anything but a table or a DataFrame is refused by name
    with pytest.raises(InputError, match="frame must be a table of tuner.study.analysis or a pandas DataFrame"):
        pareto_mask(trials.frame.to_dict("records"))  # type: ignore[arg-type]
    assert list(pareto_mask(trials)) == list(pareto_mask(trials.frame))


def test_best_trial_is_the_fastest_feasible(sim_study_db):
    study = open_study(sim_study_db)
    frame = trials_frame(study).frame
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
    runs = sweep.frame
    assert len(sweep) == len(runs) >= 3
    est = load_plan(study)
    assert sweep.target_ttft_s == est.target_ttft_s == TARGET_S
    assert (sweep.plan, sweep.trial) == (f"trial {est.trial} at {TARGET_S:g} s", est.trial)
    assert (sweep.max_load, sweep.bound, sweep.load_kind) == (est.max_load, est.bound, est.load_kind)
    assert (sweep.tokens_per_s, sweep.max_concurrency, sweep.slos) == (est.tokens_per_s, est.max_concurrency, ())
    assert list(runs["meets"]) == [bool(p <= TARGET_S) for p in runs["ttft_p95_s"]]
    # the capacity lies between the loads that met the target and the first that did not
    met = runs.loc[runs["meets"], "level"]
    missed = runs.loc[~runs["meets"], "level"]
    assert met.max() <= sweep.max_load + 1e-9
    if len(missed) and sweep.bound == "interpolated":
        assert sweep.max_load < missed.min()


def test_plan_sweep_without_a_plan_is_empty():
    sweep = plan_sweep(optuna.create_study())
    assert sweep.empty and "ttft_p95_s" in sweep.frame.columns and sweep.plan is None
    assert (sweep.max_load, sweep.trial, sweep.slos) == (None, None, ())
    assert "no capacity plan" in repr(sweep)


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
    frame = trials_frame(study).frame
    assert list(frame["errors"])[:2] == ["http_429 x24", "timeout x1"] and pd.isna(frame.loc[2, "errors"])
    assert frame.loc[0, "failed_by"] == "errors" and "http_429 x24" in frame.loc[0, "reason"]
    assert "sk-old-secret" not in frame.to_csv() and "http://***@h:8000" in frame.loc[2, "reason"]
    assert error_totals(study) == {"http_429": 24, "timeout": 4}


#: One L4, every knob fixed but two without effect on the built-in mix (no shared prefixes,
#: longest request well under 4096 tokens) and max_num_seqs, which has one: 8 trials, two
#: effective configurations of four trials each.
PREFIX_SPACE = """
name: prefix-test
deployment: {model: qwen2.5-7b, gpu: L4, gpus: 1}
workload: {target_ttft_s: 1s, requests: 40, load: concurrency, seed: 0}
parameters:
  gpu_memory_utilization: {choices: [0.9]}
  max_num_seqs: {choices: [16, 32]}
  max_model_len: {choices: [4096, 8192]}
  enable_prefix_caching: {choices: [true, false]}
layouts: [tp1x1]
"""
_PREFIX: dict[str, str] = {}


@pytest.fixture(scope="session")
def prefix_study_db(tmp_path_factory) -> str:
    """A sim study (grid sampler, no confirmation races) whose trials differ in prefix
    caching and max-model-len: each configuration tried once (~5 s, built once)."""
    if "db" not in _PREFIX:
        from tuner.search import num_heads, run_search
        from tuner.space import load_space

        folder = tmp_path_factory.mktemp("prefix_study")
        (folder / "space.yaml").write_text(PREFIX_SPACE, encoding="utf-8")
        space = load_space(str(folder / "space.yaml"))
        space = space.bind(space.deployment, num_heads(space.deployment))
        db = folder / "prefix-test.db"
        run_search(space, budget=8, storage=f"sqlite:///{db}", study="prefix-test", seed=0, sampler="grid",
                   predictor=None, max_replays=3, confirm=0)
        _PREFIX["db"] = str(db)
    return _PREFIX["db"]


def test_trials_differing_only_in_knobs_without_effect_are_one_group(prefix_study_db):
    study = open_study(prefix_study_db)
    frame = trials_frame(study).frame
    assert len(frame) == 8 and frame["feasible"].all()
    assert not any(t.user_attrs["run"]["workload_shares_prefixes"] for t in study.trials)
    assert frame.groupby("group")["number"].count().tolist() == [4, 4]
    for _, members in frame.groupby("group"):  # what differs within a group is only what was folded
        assert members["max_num_seqs"].nunique() == 1
        assert set(members["enable_prefix_caching"]) == {True, False}
        assert set(members["max_model_len"]) == {4096, 8192}
    assert frame["folded"].str.contains("enable_prefix_caching: no shared prefixes").all()

    groups = top_groups(study)
    top = groups.frame
    assert len(top) == 2 and list(top["trials"]) == [4, 4] and list(top["missed"]) == [0, 0]
    assert sorted(n for row in top["members"] for n in row) == list(range(8))
    # max-num-seqs 16 placed its edge at its cap (kept); 32 never met more users than it holds
    # and a higher load missed the target: folded (tuner.study.effective)
    seqs = sorted(map(str, top["max_num_seqs"]))
    assert seqs[0] == "16"
    folded = re.fullmatch(r"any \(at most (\d+) users offered, never more than max-num-seqs\)", seqs[1])
    assert folded and 16 < int(folded.group(1)) <= 32  # above the other's cap, within its own
    assert (top["enable_prefix_caching"] == "any (no shared prefixes)").all()
    assert top["max_model_len"].str.startswith("any (>= ").all()
    for _, row in top.iterrows():
        members = frame[frame["number"].isin(row["members"])]
        assert row["tokens_per_s"] == members["tokens_per_s"].max() == row["tokens_per_s_max"]
        assert row["tokens_per_s_min"] == members["tokens_per_s"].min()
        assert frame.loc[frame["number"] == row["number"], "tokens_per_s"].item() == row["tokens_per_s"]
    assert top["tokens_per_s"].is_monotonic_decreasing
    assert groups.caveat is None and groups.study == "prefix-test"
    assert len(top_groups(study, n=1)) == 1


def test_top_groups_of_a_study_without_workload_facts_keeps_every_configuration():
    """A study written before trials recorded their workload facts folds nothing: two trials
    differing only in prefix caching stay two rows, and an endpoint study says why."""
    study = optuna.create_study(direction="maximize")
    dist = {"layout": CategoricalDistribution(["tp1x1"])}
    config = {"tensor_parallel_size": 1, "replicas": 1, "max_num_seqs": 64, "max_model_len": 8192}
    old_run = {"backend": "sim", "vllm_version": "0.26.0", "hardware": {"gpu": "H200"}}
    for value, caching in ((900.0, True), (880.0, False)):
        study.add_trial(create_trial(value=value, params={"layout": "tp1x1"}, distributions=dist, user_attrs={
            "config": {**config, "enable_prefix_caching": caching}, "feasible": True, "run": old_run,
            "server": {"num_preemptions": 0}, "summary": {"tokens_per_s": value, "ttft_p95_s": 0.5}}))
    groups = top_groups(study)
    top = groups.frame
    assert list(top["number"]) == [0, 1] and list(top["trials"]) == [1, 1]
    assert list(top["enable_prefix_caching"]) == [True, False] and top["folded"].isna().all()
    assert groups.caveat is None
    # a run of trial 0's configuration that missed the target is counted beside it, not in it
    study.add_trial(create_trial(value=0.0, params={"layout": "tp1x1"}, distributions=dist, user_attrs={
        "config": {**config, "enable_prefix_caching": True}, "feasible": False, "run": old_run,
        "infeasible_reason": "P95 TTFT 1.2 s over the 1 s target", "server": {"num_preemptions": 0},
        "summary": {"tokens_per_s": 700.0, "ttft_p95_s": 1.2}}))
    top = top_groups(study).frame
    assert list(top["trials"]) == [1, 1] and list(top["missed"]) == [1, 0] and top.loc[0, "tokens_per_s_min"] == 900
    endpoint = optuna.create_study(direction="maximize")  # all facts known, but nothing was applied
    run = {**old_run, "backend": "endpoint", "workload_shares_prefixes": False, "workload_longest_tokens": 10}
    for trial in study.trials[:2]:
        endpoint.add_trial(create_trial(value=trial.value, params=trial.params, distributions=dist,
                                        user_attrs={**trial.user_attrs, "run": run}))
    groups = top_groups(endpoint)
    assert list(groups.frame["trials"]) == [1, 1] and "endpoint" in groups.caveat
    assert groups.caveat in groups.describe() and groups.caveat in groups._repr_html_()


def test_top_groups_of_an_empty_study_has_the_columns():
    top = top_groups(optuna.create_study())
    assert top.empty and set(GROUP_COLUMNS) <= set(top.frame.columns) and top.caveat is None

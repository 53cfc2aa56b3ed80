"""The public API: ``tuner.search``, ``tuner.plan`` and ``tuner.open_study`` are what the
CLI calls and what a notebook calls, with one observer convention."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import tuner
from tuner.core.errors import InputError
from tuner.serving.demand import Demand

SPACE = """
name: api-test
deployment: {model: qwen2.5-7b, gpu: L4, gpus: 1}
workload: {target_ttft_s: 1s, requests: 30, load: concurrency, seed: 0}
parameters:
  gpu_memory_utilization: {choices: [0.9, 0.95]}
  max_num_seqs: {choices: [8, 16]}
layouts: auto
"""


class Recorder(tuner.Observer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_start(self, name, finished, budget):
        self.calls.append(f"start {finished}/{budget}")

    def on_phase(self, text):
        self.calls.append("phase")

    def on_trial(self, trial, best, finished):
        self.calls.append(f"trial {finished}")


@pytest.fixture
def space(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE, encoding="utf-8")
    return path


def test_search_and_plan_are_the_modules_and_the_verbs():
    import tuner.plan
    import tuner.search

    assert callable(tuner.search) and callable(tuner.plan)
    assert tuner.search.run_search.__module__ == "tuner.search.run"
    assert tuner.plan.plan_capacity.__module__ == "tuner.plan.planner"
    with pytest.raises(AttributeError):
        tuner.no_such_thing  # noqa: B018


def test_a_notebook_searches_plans_and_reads_the_study_as_the_cli_does(space, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path}/api.db"
    seen = Recorder()
    out = tuner.search(space, storage=storage, settings=tuner.SearchSettings(budget=3, confirm=0), observer=seen)
    assert out.best is not None and out.finished == 3 and out.backend == "sim" and out.target_ttft_s == 1.0
    assert seen.calls[0] == "start 0/3" and seen.calls[-1] == "trial 3" and "phase" in seen.calls
    est = tuner.plan(study=out.study, sweep=tuner.Sweep(levels=(1, 2, 4), requests=30), observer=None)
    assert est.trial == out.best.number and est.target_ttft_s == 1.0  # the study's target
    again = tuner.open_study(tmp_path / "api.db")
    assert again.study_name == out.name and len(again.trials) == 3
    from tuner.plan import load_plan

    assert load_plan(again) == est
    assert capsys.readouterr() == ("", "")  # no observer: nothing printed

    # the command line runs the same study: resumed, not a new one
    from tuner.cli import main

    with pytest.raises(SystemExit) as done:
        main(["search", "--space", str(space), "--budget", "3", "--confirm", "0", "--storage", storage,
              "--output", "json"])
    report = json.loads(capsys.readouterr().out)
    assert done.value.code == 0 and report["study"] == out.name and report["new_trials"] == 0
    assert report["best"]["trial"] == out.best.number


def test_options_are_checked_where_they_are_made():
    with pytest.raises(InputError, match="--budget must be >= 1"):
        tuner.SearchSettings(budget=0)
    with pytest.raises(InputError, match="levels or rates, not both"):
        tuner.Sweep(levels=(1,), rates=(1.0,))
    with pytest.raises(InputError, match="--repeats must be >= 1"):
        tuner.Sweep(repeats=0)
    assert tuner.Figures(demand="1200/min").demand == Demand(1200.0)
    assert tuner.Sweep(levels=(2.7, 5)).grid == [2.0, 5.0]

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


def test_the_verbs_are_plain_functions_with_their_parameters():
    import inspect

    import tuner.plan  # noqa: F401  (a submodule imported later leaves the verb in place)
    import tuner.search.workflow  # noqa: F401

    for verb in (tuner.search, tuner.plan, tuner.open_study):
        assert inspect.isfunction(verb) and verb.__module__ == "tuner" and "Args:" in verb.__doc__
    search = inspect.signature(tuner.search).parameters
    assert {"space", "deployment", "workload", "slo", "backend", "settings", "observer"} <= set(search)
    assert search["deployment"].kind is inspect.Parameter.KEYWORD_ONLY
    assert {"target_ttft_s", "study", "trial", "deployment", "sweep", "slo"} <= set(inspect.signature(tuner.plan).parameters)  # noqa: E501
    assert list(inspect.signature(tuner.open_study).parameters) == ["path_or_name", "storage"]
    # the packages are still there to import from
    from tuner.plan import plan_capacity
    from tuner.search import run_search
    assert run_search.__module__ == "tuner.search.run" and plan_capacity.__module__ == "tuner.plan.planner"
    with pytest.raises(AttributeError):
        tuner.no_such_thing  # noqa: B018


def test_all_lists_the_public_names_only():
    assert all(not n.startswith("_") or n == "__version__" for n in tuner.__all__)
    assert {"search", "plan", "open_study", "Deployment", "WorkloadSpec", "SloSet", "SearchSettings"} <= set(tuner.__all__)  # noqa: E501
    for name in tuner.__all__:
        getattr(tuner, name)


def test_a_search_takes_the_objects_it_speaks_of(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE, encoding="utf-8")
    out = tuner.search(space, deployment=tuner.Deployment(model="qwen2.5-7b", gpu="L4", gpu_count=1),
                       workload=tuner.WorkloadSpec(slo=tuner.SloSet.of("p95:ttft<=1.5s"), requests=30),
                       slo=["p99:tpot<=200ms"], storage=f"sqlite:///{tmp_path}/o.db",
                       settings=tuner.SearchSettings(budget=2, confirm=0))
    assert out.finished == 2 and out.target_ttft_s == 1.5 and out.slos == ("p95:ttft<=1.5s", "p99:tpot<=200ms")
    assert out.deployment.gpu == "L4"


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"deployment": {"gpus": 2}}, "deployment has no field 'gpus'"),
    ({"deployment": "H100"}, "deployment must be a Deployment or a dict of its fields, got str"),
    ({"workload": 3}, "workload must be a WorkloadSpec or a dict of its fields, got int"),
    ({"workload": {"requests": 0}}, "requests must be a whole number"),
    ({"slo": "p99:tpot<30ms"}, "slo: "),
    ({"settings": {"budget": 3}}, "settings must be a SearchSettings, got dict"),
])
def test_a_bad_argument_is_one_line_that_names_it(kwargs, says, space):
    with pytest.raises(InputError) as err:
        tuner.search(space, **kwargs)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_library_errors_name_the_argument_and_the_cli_the_flag(capsys):
    with pytest.raises(InputError, match="^budget must be >= 1, got 0$"):
        tuner.SearchSettings(budget=0)
    with pytest.raises(InputError, match="^sweep must be a Sweep, got dict"):
        tuner.plan(sweep={"levels": (1,)})
    from tuner.cli import main

    with pytest.raises(SystemExit) as done:
        main(["search", "--budget", "0"])
    assert done.value.code == 2 and capsys.readouterr().err.startswith("tuner: --budget must be >= 1, got 0")


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
    with pytest.raises(InputError, match="levels or rates, not both"):
        tuner.Sweep(levels=(1,), rates=(1.0,))
    with pytest.raises(InputError, match="--repeats must be >= 1"):
        tuner.Sweep(repeats=0)
    assert tuner.Figures(demand="1200/min").demand == Demand(1200.0)
    assert tuner.Sweep(levels=(2.7, 5)).grid == [2.0, 5.0]

"""The typed records of a study: read from any schema version, written back unchanged."""
from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest

from tuner.core.errors import InputError
from tuner.serving.config import Deployment, ServeConfig
from tuner.study.record import SCHEMA_VERSION, STUDY_SCHEMA_VERSION, StudyRecord, TrialRecord, migrate

FIXTURE = Path(__file__).parent / "fixtures" / "study-0.1.0"


@pytest.fixture(scope="module")
def old_study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("old")
    shutil.copy(FIXTURE / "study.db", folder / "study.db")
    return optuna.load_study(study_name="release-0.1.0", storage=f"sqlite:///{folder}/study.db")


def test_every_trial_of_a_0_1_0_study_reads_and_writes_back_what_it_stored(old_study):
    for t in old_study.trials:
        rec = TrialRecord.from_trial(t)
        attrs = rec.to_attrs()
        assert attrs.pop("schema_version") == SCHEMA_VERSION
        stored = {k: v for k, v in t.user_attrs.items() if v is not None}
        run = {k: v for k, v in stored.pop("run").items() if v not in (None, [], {})}  # nor are nulls and empties
        assert attrs.pop("run") == run
        assert attrs == stored
        assert TrialRecord.from_attrs(rec.to_attrs()) == rec
        assert rec.tags == {}  # 0.1.0 wrote no key the record does not know


def test_a_0_1_0_record_reads_as_the_search_wrote_it(old_study):
    records = {t.number: TrialRecord.from_trial(t) for t in old_study.trials}
    refused = [r for r in records.values() if r.rejected_kind]
    assert refused and all(r.feasible is False and r.rejected_at == "pre-check" and r.gpu_s == 0.0 for r in refused)
    missed = [r for r in records.values() if r.failed_by == "latency"]
    assert missed and all(r.p95_ttft_at_lowest_load_s > r.target_ttft_s for r in missed)
    for r in records.values():
        assert isinstance(r.config, ServeConfig) and r.run.hardware == Deployment.from_dict(
            old_study.user_attrs["deployment"])
        if r.feasible:
            passed = [p for p in r.loads if p.passed]
            assert r.edge.level == max(p.level for p in passed) and r.chosen_load in {p.load for p in passed}
    confirming = [r for r in records.values() if r.is_confirmation]
    assert confirming and all(records[r.confirm_of].feasible for r in confirming)


def test_the_oldest_trials_kept_the_start_facts_beside_run():
    rec = TrialRecord.from_attrs({"config": {"max_num_seqs": 8}, "plan": {"kv_cache_tokens": 1000},
                                  "vllm_version": "0.6.3", "log_paths": ["a.log"], "startup_s": 40.0,
                                  "run": {"backend": "vllm"}})
    assert rec.run.plan == {"kv_cache_tokens": 1000} and rec.run.vllm_version == "0.6.3"
    assert rec.run.log_paths == ("a.log",) and rec.run.startup_s == 40.0 and rec.run.backend == "vllm"
    assert "plan" not in rec.to_attrs() and rec.to_attrs()["run"]["plan"] == {"kv_cache_tokens": 1000}


def test_keys_a_run_stamped_are_tags_written_back_under_their_names():
    rec = TrialRecord.from_attrs({"schema_version": 2, "night": "2025-01-01T00:00:00+00:00", "feasible": False})
    assert rec.tags == {"night": "2025-01-01T00:00:00+00:00"} and rec.feasible is False
    assert rec.to_attrs() == {"schema_version": 2, "night": "2025-01-01T00:00:00+00:00", "feasible": False}


def test_a_record_from_a_newer_tuner_or_not_from_tuner_is_one_line_of_bad_input():
    with pytest.raises(InputError, match="newer tuner"):
        migrate({"schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(InputError, match="trial 3 holds attrs tuner cannot read.*no_such_knob"):
        TrialRecord.from_attrs({"config": {"no_such_knob": 1}}, trial=3)


def test_an_unset_record_writes_only_its_version_and_a_partial_one_only_what_is_set():
    assert TrialRecord().to_attrs() == {"schema_version": SCHEMA_VERSION}
    assert TrialRecord(warm_start=True).to_attrs() == {"schema_version": SCHEMA_VERSION, "warm_start": True}


def test_deployment_and_study_records_round_trip(old_study):
    dep = Deployment(gpu="L4", gpu_count=2, gpu_ids=(4, 5))
    assert Deployment.from_dict(dep.to_dict()) == dep
    with pytest.raises(InputError, match="unknown Deployment field.*gpus"):
        Deployment.from_dict({"gpus": 2})
    study = StudyRecord.from_study(old_study)
    assert study.schema_version == 1 and study.deployment.gpu == "L4" and study.target_ttft_s == 0.3
    assert study.objective == "tokens"  # migrated: stamped before the objective was
    again = StudyRecord(**{**{f: getattr(study, f) for f in StudyRecord.__slots__},
                           "schema_version": STUDY_SCHEMA_VERSION})
    attrs = again.to_attrs()
    assert attrs.pop("objective") == "tokens"
    assert {k: v for k, v in attrs.items() if k != "schema_version"} == {
        k: v for k, v in old_study.user_attrs.items() if k in attrs}


@pytest.mark.parametrize(("name", "objective"), [("a.ttft2s.p99tpot30ms.sim", "tokens"),
                                                 ("a.ttft2s.p99tpot30ms.sim.goodput", "goodput")])
def test_a_study_stamped_before_the_objective_reads_it_from_its_name(name, objective):
    import optuna

    study = optuna.create_study(study_name=name)
    for key, value in {"schema_version": 2, "space": "default", "target_ttft_s": 2.0,
                       "slos": ["p99:tpot<=30ms"]}.items():
        study.set_user_attr(key, value)
    stamp = StudyRecord.from_study(study)
    assert stamp.objective == objective and stamp.slos == ("p99:tpot<=30ms",) and stamp.schema_version == 2
    assert StudyRecord.from_study(optuna.create_study(study_name="x.goodput")).objective is None  # never stamped


def test_a_study_stamped_by_a_newer_tuner_is_refused_in_one_line():
    import optuna

    study = optuna.create_study(study_name="s")
    study.set_user_attr("schema_version", STUDY_SCHEMA_VERSION + 1)
    with pytest.raises(InputError, match=r"^study 's' was written by a newer tuner \(study record version 4"):
        StudyRecord.from_study(study)
    study.set_user_attr("schema_version", STUDY_SCHEMA_VERSION)
    study.set_user_attr("objective", "latency")
    with pytest.raises(InputError, match="objective 'latency' is not one of tokens, goodput"):
        StudyRecord.from_study(study)


def test_what_the_search_writes_reads_back_whole_and_holds_no_key_the_record_does_not_know(tmp_path):
    from fakes import FakeBackend, small_workload
    from test_search import fake_space

    from tuner.search import run_search

    out = run_search(fake_space(), backend=FakeBackend(), workload=small_workload(), budget=6,
                     storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=2, confirm=1,
                     tags={"night": "tonight"})
    from tuner.study import repeats

    kinds = set()
    for t in out.study.trials + repeats(out.study):  # the study's configurations, then its companion's repeats
        rec = TrialRecord.from_trial(t)
        assert rec.to_attrs() == t.user_attrs and rec.schema_version == SCHEMA_VERSION
        assert rec.tags == {"night": "tonight"}
        kinds.add("refused" if rec.rejected_kind else "confirmation" if rec.is_confirmation
                  else "repeat" if rec.is_repeat else t.state.name)
    assert {"refused", "confirmation", "COMPLETE"} <= kinds
    assert not any(TrialRecord.from_trial(t).is_confirmation for t in out.study.trials)
    stamp = StudyRecord.from_study(out.study)
    assert stamp.confirmation_study == out.name + ".confirm" and stamp.confirmation["winner"] == out.best.number
    assert StudyRecord.from_study(out.study).schema_version == STUDY_SCHEMA_VERSION
    assert StudyRecord.from_study(out.study).objective == "tokens"


def test_a_finished_trial_is_read_once_and_a_running_one_every_look(tmp_path):
    import copy

    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(storage=storage, study_name="s")
    running = study.ask()
    for seqs in (64, 128):  # a running trial's attrs change: every look reads them anew
        for key, value in TrialRecord(config=ServeConfig(max_num_seqs=seqs)).to_attrs().items():
            running.set_user_attr(key, value)
        live = study.get_trials(deepcopy=False)[0]
        assert TrialRecord.from_trial(live).config.max_num_seqs == seqs
    study.tell(running, 1.0)
    done = study.get_trials(deepcopy=False)[0]
    first = TrialRecord.from_trial(done)
    assert first.config.max_num_seqs == 128
    assert TrialRecord.from_trial(study.get_trials(deepcopy=False)[0]) is first  # the storage's same object
    # another object of the same trial (a copy, another process's study) is read on its own, equal
    other = copy.deepcopy(done)
    assert TrialRecord.from_trial(other) == first and TrialRecord.from_trial(other) is not first
    # a finished trial of another study, whatever object it is, never gets this one's record
    again = optuna.create_study(storage=f"sqlite:///{tmp_path}/t.db", study_name="t")
    t = again.ask()
    for key, value in TrialRecord(config=ServeConfig(max_num_seqs=8)).to_attrs().items():
        t.set_user_attr(key, value)
    again.tell(t, 2.0)
    del done, other, study
    assert TrialRecord.from_trial(again.get_trials(deepcopy=False)[0]).config.max_num_seqs == 8


def test_a_study_reads_each_trial_a_bounded_number_of_times_not_once_per_look(tmp_path):
    """The search looks at every trial after each one (budget, copies, boundary, feasibility):
    were each look to parse every trial's attrs, the parses would grow with the square of
    the trials (8,536 at 36 trials against 1,164 at 12, measured with the memo bypassed)."""
    from unittest import mock

    from fakes import FakeBackend, small_workload
    from test_search import fake_space

    from tuner.search import run_search

    space = fake_space("""\
name: fake
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 2}
workload: {target_ttft_s: 1s, requests: 60}
parameters:
  gpu_memory_utilization: {choices: [0.8, 0.85, 0.9, 0.92, 0.95]}
  max_num_seqs: {choices: [16, 32, 64, 128, 256]}
  enforce_eager: {choices: [false, true]}
layouts: [tp1x2, tp2x1]
""")
    read = TrialRecord.from_attrs.__func__
    parses = {}
    for budget in (12, 36):
        count = [0]

        def counting(cls, *args, count=count, **kw):
            count[0] += 1
            return read(cls, *args, **kw)

        with mock.patch.object(TrialRecord, "from_attrs", classmethod(counting)):
            run_search(space, backend=FakeBackend(), workload=small_workload(), budget=budget,
                       storage=f"sqlite:///{tmp_path}/{budget}.db", seed=1)
        parses[budget] = count[0]
    assert parses[36] < 3.5 * parses[12], parses  # linear: x3 the trials, about x3 the parses
    assert parses[36] < 10 * 36, parses

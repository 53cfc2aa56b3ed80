"""Failures the log cannot pin on a configuration are judged against the study
(tuner.search.blame), and a server killed from outside is measured again once: none of
them is stored infeasible, counted in the budget or shown to the sampler; two in a row
stop the run with one line. Staged under TPE as well as grid."""
from __future__ import annotations

import pytest
from fakes import FakeBackend, FakeInstance, small_workload
from optuna.trial import TrialState

from tuner.core.errors import ConfigRejected, EnvironmentFault
from tuner.search import run_search
from tuner.serving.config import Deployment
from tuner.space import parse_space
from tuner.study import is_copy
from tuner.study.record import TrialRecord

SPACE = """\
name: blame
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 1}
workload: {target_ttft_s: 1s, requests: 60}
parameters:
  max_num_seqs: {choices: [16, 64]}
  max_model_len: {choices: [2048, 4096]}
layouts: [tp1x1]
"""
SAMPLERS = ["grid", "tpe"]


def space():
    return parse_space(SPACE, path="blame.yaml").bind(Deployment(gpu_count=1), num_heads=28)


def search(backend, tmp_path, sampler, budget=4):
    return run_search(space(), backend=backend, workload=small_workload(), budget=budget, sampler=sampler,
                      storage=f"sqlite:///{tmp_path}/s.db", study="s", confirm=0, precheck=False)


class Refusing(FakeBackend):
    """Every start fails the same way, after ``ok`` starts that succeed."""

    def __init__(self, err, ok: int = 0) -> None:
        super().__init__()
        self.err, self.ok = err, ok

    def start(self, deployment, config):
        self.started.append(config)
        if len(self.started) <= self.ok:
            return FakeInstance(config, self.ttft_per_user)
        raise self.err(config)


def stored(outcome):
    trials = outcome.study.get_trials(deepcopy=False)
    return ([TrialRecord.from_trial(t).fail_kind for t in trials if t.state == TrialState.FAIL],
            [t for t in trials if t.state == TrialState.COMPLETE and not is_copy(t)])  # copies: free


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_start_that_times_out_for_every_configuration_stops_the_run_and_nothing_is_stored(tmp_path, sampler):
    backend = Refusing(lambda c: ConfigRejected("timeout", "no healthy server after 15 s (--startup-timeout)"))
    with pytest.raises(EnvironmentFault) as err:
        search(backend, tmp_path, sampler)
    assert "2 environment faults in a row" in str(err.value) and "--startup-timeout" in str(err.value)
    assert "\n" not in str(err.value) and err.value.exit_code == 2
    assert len({(c.max_num_seqs, c.max_model_len) for c in backend.started}) == 2  # two that differ
    from tuner.study import open_study

    st = open_study("s", f"sqlite:///{tmp_path}/s.db")
    kinds = [TrialRecord.from_trial(t).fail_kind for t in st.get_trials(deepcopy=False)]
    assert kinds == ["environment", "environment"]  # none stored infeasible, none counted


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_timeout_after_other_configurations_started_is_that_configurations(tmp_path, sampler):
    backend = Refusing(lambda c: ConfigRejected("timeout", f"no healthy server ({c.max_num_seqs})"), ok=2)
    out = search(backend, tmp_path, sampler)
    fails, complete = stored(out)
    assert fails == [] and len(complete) == 4 and out.finished == 4
    timeouts = [t for t in complete if TrialRecord.from_trial(t).rejected_kind == "timeout"]
    assert len(backend.started) > 2 and timeouts  # stored as those configurations' own timeouts


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_same_crash_for_configurations_that_differ_is_the_machines(tmp_path, sampler):
    line = "exit code 1; RuntimeError: NCCL error: unhandled system error (run 17)"
    backend = Refusing(lambda c: ConfigRejected("crash", line.replace("17", str(c.max_num_seqs))), ok=1)
    with pytest.raises(EnvironmentFault) as err:
        search(backend, tmp_path, sampler)
    assert "same line" in str(err.value)
    # the first crash was the configuration's as far as anyone could tell; the next two were not
    from tuner.study import open_study

    st = open_study("s", f"sqlite:///{tmp_path}/s.db")
    recs = [TrialRecord.from_trial(t) for t in st.get_trials(deepcopy=False)]
    assert [r.fail_kind for r in recs].count("environment") == 2
    assert [r.rejected_kind for r in recs].count("crash") == 1


class KilledOnce(FakeBackend):
    """The server of the ``victim``-th start is killed from outside mid-replay ``times`` times."""

    def __init__(self, victim: int = 2, times: int = 1) -> None:
        super().__init__()
        self.victim, self.times, self.killed = victim, times, 0

    def start(self, deployment, config):
        inst = super().start(deployment, config)
        if len(self.started) >= self.victim and self.killed < self.times:
            self.killed += 1

            def run(*a, **k):
                raise EnvironmentFault("killed", "vLLM replica died during the run: the server was killed by "
                                       "SIGKILL, which tuner did not send")
            inst.run = run
        return inst


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_server_killed_from_outside_is_measured_again_once_and_costs_no_budget(tmp_path, sampler):
    backend = KilledOnce()
    out = search(backend, tmp_path, sampler)
    fails, complete = stored(out)
    assert fails == ["environment"] and out.finished == 4 and len(complete) == 4
    victim = backend.started[1]
    assert backend.started.count(victim) == 2  # killed, then measured
    assert any(TrialRecord.from_trial(t).config == victim and t.value > 0 for t in complete)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_killed_again_on_the_retry_stops_the_run(tmp_path, sampler):
    with pytest.raises(EnvironmentFault) as err:
        search(KilledOnce(times=2), tmp_path, sampler)
    assert "2 environment faults in a row" in str(err.value) and "SIGKILL" in str(err.value)


def test_a_run_whose_last_trial_is_an_environment_fault_exits_2_not_no_configuration(tmp_path):
    one = space()
    one = parse_space(SPACE.replace("{choices: [16, 64]}", "16").replace("{choices: [2048, 4096]}", "2048"),
                      path="blame.yaml").bind(Deployment(gpu_count=1), num_heads=28)
    backend = Refusing(lambda c: EnvironmentFault("before_engine", "the server died before vLLM's engine started"))
    with pytest.raises(EnvironmentFault) as err:
        run_search(one, backend=backend, workload=small_workload(), budget=1, sampler="grid",
                   storage=f"sqlite:///{tmp_path}/s.db", study="s", confirm=0, precheck=False)
    assert "ended on an environment fault" in str(err.value) and err.value.exit_code == 2

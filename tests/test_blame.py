"""Failures the log cannot pin on a configuration are judged against the study
(tuner.search.blame), and a server killed from outside is measured again once: none of
them is stored infeasible, counted in the budget or shown to the sampler; two in a row
stop the run with one line. Staged under TPE as well as grid."""
from __future__ import annotations

import pytest
from fakes import FakeBackend, FakeInstance, small_workload
from optuna.trial import TrialState

from tuner.core.errors import ConfigRejected, Disrupted, EnvironmentFault
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


def study_records(tmp_path):
    from tuner.study import open_study

    st = open_study("s", f"sqlite:///{tmp_path}/s.db")
    return [(t, TrialRecord.from_trial(t)) for t in st.get_trials(deepcopy=False)]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_start_that_times_out_for_every_configuration_stops_the_run_and_nothing_is_stored(tmp_path, sampler):
    backend = Refusing(lambda c: ConfigRejected("timeout", "no healthy server after 15 s (--startup-timeout)"))
    with pytest.raises(EnvironmentFault) as err:
        search(backend, tmp_path, sampler)
    assert "2 environment faults in a row" in str(err.value) and "--startup-timeout" in str(err.value)
    assert "\n" not in str(err.value) and err.value.exit_code == 2
    # each started twice; the first could not be told (nothing had worked), the next two failed alike
    assert len(backend.started) == 6 and len({(c.max_num_seqs, c.max_model_len) for c in backend.started}) >= 2
    recs = study_records(tmp_path)
    assert [r.fail_kind for _, r in recs] == ["environment"] * 3  # none stored infeasible, none counted
    assert [r.fail_reason.split(":")[0] for _, r in recs] == ["undecided", "same_failure", "same_failure"]
    assert all(r.blame["starts"] == 2 and r.blame["control"] is None for _, r in recs)


class RefusesOne(FakeBackend):
    """Every start of the configurations ``bad`` picks fails with ``err``; the rest serve."""

    def __init__(self, bad, err) -> None:
        super().__init__()
        self.bad, self.err = bad, err

    def start(self, deployment, config):
        self.started.append(config)
        if self.bad(config):
            raise self.err(config)
        return FakeInstance(config, self.ttft_per_user)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_failure_that_repeats_while_a_control_serves_is_the_configurations(tmp_path, sampler):
    backend = RefusesOne(lambda c: c.max_num_seqs == 64 and c.max_model_len == 4096,
                         lambda c: ConfigRejected("crash", "exit code 1; RuntimeError: CUDA error: an illegal memory "
                                                  "access was encountered"))
    out = search(backend, tmp_path, sampler)
    assert out.finished == 4
    recs = study_records(tmp_path)
    # met before anything had worked, it waited (not counted) and was judged once something had
    assert all(r.fail_reason.startswith("undecided:") for _, r in recs if r.fail_kind)
    bad = [r for t, r in recs if r.infeasible_reason and not r.is_repeat]
    assert len(bad) == 1 and "illegal memory access" in bad[0].infeasible_reason
    assert "the configuration's fault" in bad[0].infeasible_reason and bad[0].blame["verdict"] == "configuration"
    k = bad[0].blame["control"]
    assert k is not None and f"trial {k}'s configuration served" in bad[0].infeasible_reason
    waited = sum(1 for _, r in recs if r.fail_kind)
    # twice each time it waited; judged: twice, the control, a third time
    assert backend.started.count(bad[0].config) == 2 * waited + 3
    assert bad[0].blame["starts"] == 3 and bad[0].blame["verdict"] == "configuration"
    # the run says what judging cost: two more starts of the configuration and the control (and,
    # each time it waited, the start after its first)
    note = next(n for n in out.notes if n.startswith("whose fault a failure was took"))
    assert f"took {3 + waited} extra starts" in note and ": 1 control run of" in note


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_failure_the_control_meets_too_is_the_machines_and_two_stop_the_run(tmp_path, sampler):
    line = "exit code 1; RuntimeError: NCCL error: unhandled system error (handle 0x7f3a{:04x}, pid {})"
    calls = iter(range(10**6))
    backend = Refusing(lambda c: ConfigRejected("crash", line.format(next(calls), 4000 + next(calls))), ok=1)
    with pytest.raises(EnvironmentFault) as err:
        search(backend, tmp_path, sampler)
    assert "2 environment faults in a row" in str(err.value)
    recs = study_records(tmp_path)
    assert not [r for _, r in recs if r.infeasible_reason]  # nothing stored as a configuration's
    # the control (the first trial's configuration, which served) failed too; then the same
    # failure (ids aside) is known as the machine's: three starts, no control needed
    kinds = [r.fail_reason.split(":")[0] for _, r in recs if r.fail_kind]
    assert kinds[0] == "control" and set(kinds[1:]) == {"transient"}  # (TPE: a copy between them clears the count)
    first, *later = [r.blame for _, r in recs if r.fail_kind]
    assert first["control"] == 0 and first["starts"] == 2
    assert all(b["control"] is None and b["starts"] == 3 for b in later)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_failures_naming_a_knobs_value_are_the_configurations_before_anything_works(tmp_path, sampler):
    """Every max_num_seqs of 64 crashes, vLLM's line naming the value, and so does every
    max_model_len of 4096 with max_num_seqs 16 (another value of the named knob fails alike)."""
    def err(c):
        return ConfigRejected("crash", f"exit code 1; RuntimeError: max_num_seqs={c.max_num_seqs} needs more than "
                              "the 15 sequences this build's graph pool holds")
    backend = RefusesOne(lambda c: c.max_num_seqs == 64 or c.max_model_len == 4096, err)
    out = search(backend, tmp_path, sampler)
    recs = study_records(tmp_path)
    blamed = {(r.config.max_num_seqs, r.config.max_model_len) for _, r in recs if r.infeasible_reason}
    assert blamed == {(64, 2048), (64, 4096), (16, 4096)} and out.finished == 4
    assert all("max_num_seqs=" in r.infeasible_reason for _, r in recs if r.infeasible_reason)


class FlakyOnce(FakeBackend):
    """The first start of every configuration crashes (a transient fault of the machine)."""

    def start(self, deployment, config):
        first = config not in self.started
        self.started.append(config)
        if first:
            raise ConfigRejected("crash", "exit code 1; RuntimeError: CUDA error: unspecified launch failure "
                                 f"(at 0x7f{len(self.started):08x})")
        return FakeInstance(config, self.ttft_per_user)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_crash_that_does_not_repeat_is_never_stored_and_is_remembered_as_the_machines(tmp_path, sampler):
    backend = FlakyOnce()
    out = search(backend, tmp_path, sampler)
    fails, complete = stored(out)
    assert fails == [] and out.finished == 4 and len(complete) == 4
    assert all(t.value > 0 for t in complete)
    recs = [r for _, r in study_records(tmp_path)]
    assert all(r.blame["verdict"] == "measured" and r.blame["starts"] == 2 for r in recs)


class StallsOnce(FakeBackend):
    """The second trial's replay is disrupted once (every stream stalled: Disrupted)."""

    def start(self, deployment, config):
        inst = super().start(deployment, config)
        if len(self.started) == 2:
            def run(*a, **k):
                raise Disrupted("every stream stalled at once for 20.0 s")
            inst.run = run
        return inst


def test_a_disrupted_measurement_is_measured_again_and_never_stored(tmp_path):
    backend = StallsOnce()
    out = search(backend, tmp_path, "grid")
    fails, complete = stored(out)
    assert fails == [] and out.finished == 4 and all(t.value > 0 for t in complete)
    assert backend.started[1] == backend.started[2]  # the disrupted one started again at once
    assert not any("stalled" in str(r.infeasible_reason) for _, r in study_records(tmp_path))


def test_signatures_drop_ids_and_keep_knob_values():
    from tuner.search.blame import named_knobs, signature

    a = "NCCL error (handle 0x7f3a9c01b2d0 at 127.0.0.1:43117, pid 1234) 12-06 22:11:14 [log: /x/a.log]"
    b = "NCCL error (handle 0x7f00000000aa at 127.0.0.1:51002, pid 99) 12-07 01:02:03 [log: /y/b.log]"
    assert signature(a) == signature(b)
    assert signature("max_num_seqs=256 needs more") != signature("max_num_seqs=512 needs more")
    assert named_knobs("--max-num-seqs 256 is too many; gpu_memory_utilization") == ["gpu_memory_utilization",
                                                                                    "max_num_seqs"]


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

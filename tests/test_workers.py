"""Several ``tuner search`` workers on one study: the global budget, attribution, a
worker killed mid-trial (heartbeat, fail, one retry), and SQLite's single writer."""
from __future__ import annotations

import collections
import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from pg_db import pg_url  # noqa: F401  (fixture)

from tuner.study import copy_slots, is_copy, repeats
from tuner.study.locks import StudyLock, driver_url
from tuner.study.record import TrialRecord
from tuner.study.storage import RetryOnce, trial_id
from tuner.study.workers import MEASURING, Worker, budget_used

STUDY = "workers-test"
BUDGET = 40


def small_trace(folder: Path) -> Path:
    from tuner.traffic import native
    from tuner.traffic.synth import default_workload

    return native.write(default_workload(seed=1, n=60), folder / "small.jsonl")


def spawn(folder: Path, storage: str, trace: Path, *, budget: int = BUDGET, study: str = STUDY) -> subprocess.Popen:
    # a 2 s heartbeat (6 s grace): a dead worker is noticed quickly; a live one starved on
    # busy cores may be taken for dead too, which check_failures holds to what workers.py says
    env = dict(os.environ, TUNER_HEARTBEAT_S="2", PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "tuner", "search", "--trace", str(trace), "--budget", str(budget),
            "--storage", storage, "--study", study, "--output", "json"]
    return subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def load(url: str) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=driver_url(url))


def check_failures(trials: list, stderr: dict[int, str], dead: frozenset[int] = frozenset()) -> None:
    """Every FAIL is a trial of a killed worker (``dead`` pids) or of a live worker that
    stalled past the grace period on a starved machine, was taken for dead and said so
    (its ``stderr``, by pid): documented behaviour (tuner/study/workers.py). Each was retried
    exactly once with its parameters, unless it was itself a retry (one retry at most)."""
    by_number = {t.number: t for t in trials}
    retries = collections.Counter(t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs)
    assert all(v == 1 for v in retries.values()), retries
    for number in retries:
        failed = by_number[number]
        retry = next(t for t in trials if t.user_attrs.get("retry_of") == number)
        # (a worker that stalled before drawing its configuration leaves the retry to draw one)
        assert failed.state == TrialState.FAIL and (retry.params == failed.params or not failed.params)
    for t in trials:
        if t.state != TrialState.FAIL:
            continue
        pid = t.user_attrs.get("pid")  # None: stalled before it could sign the trial
        said = stderr.get(pid, "") if pid is not None else "".join(stderr.values())
        assert pid in dead or f"trial {t.number} was marked failed" in said, (t.number, pid)
        assert t.number in retries or "retry_of" in t.user_attrs, f"trial {t.number} failed and was not retried"


def check_no_double_evaluation(trials: list) -> None:
    """Each configuration was measured once: one COMPLETE trial ran it (a retry, or a
    trial that waited for a twin whose worker then died, may be that one); the others
    copy its result (``repeat_of``, which launch nothing). A FAIL measured nothing."""
    ran = [t for t in trials if t.state == TrialState.COMPLETE and "repeat_of" not in t.user_attrs]
    counts = collections.Counter(tuple(sorted(t.params.items())) for t in ran)
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1]
    for t in trials:
        if "repeat_of" in t.user_attrs:
            earlier = trials[t.user_attrs["repeat_of"]]
            assert earlier.params == t.params and earlier.value == t.value


def test_budget_counts_running_trials_and_a_retried_failure_once():
    st = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.IntDistribution(0, 9)}

    def add(state, x, **system):
        st.add_trial(optuna.create_trial(state=state, params={"x": x}, distributions=dist,
                                         value=1.0 if state == TrialState.COMPLETE else None, system_attrs=system))

    add(TrialState.COMPLETE, 0)          # 0 counts
    add(TrialState.FAIL, 1)              # 1 retried below: counted through its retry
    add(TrialState.FAIL, 2)              # 2 a crash, never retried: counts
    add(TrialState.COMPLETE, 1, failed_trial=1, retry_history=[1])  # 3 the retry of 1
    add(TrialState.WAITING, 3)           # 4 queued, not started: does not count
    st.ask()                             # 5 takes the waiting trial: RUNNING
    assert budget_used(st, shared=True) == (4, 1)
    assert budget_used(st, shared=False) == (3, 0)  # SQLite: a RUNNING leftover of a killed process
    # 6: RUNNING for an hour and claimed by no worker (no heartbeat will ever fail it)
    st.add_trial(optuna.trial.FrozenTrial(
        number=6, trial_id=6, state=TrialState.RUNNING, value=None, datetime_complete=None,
        datetime_start=datetime.datetime.now() - datetime.timedelta(hours=1), params={"x": 4},
        distributions=dist, user_attrs={}, system_attrs={}, intermediate_values={}))
    assert budget_used(st, shared=True) == (4, 1)


def test_a_retry_starts_clean_of_the_dead_run_but_keeps_its_parameters():
    st = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.IntDistribution(0, 9)}
    st.add_trial(optuna.create_trial(
        state=TrialState.FAIL, params={"x": 3}, distributions=dist,
        user_attrs={"worker": "h:1", "feasible": False, "warm_start": True},
        system_attrs={"constraints": [0.5], "constraints:p95_ttft_over_target": 0.5, MEASURING: True}))
    RetryOnce()(st, st.trials[0])
    retry = st.trials[1]
    assert retry.state == TrialState.WAITING and retry.params == {"x": 3}
    assert retry.system_attrs["failed_trial"] == 0
    assert not any(k.startswith("constraints") or k == MEASURING for k in retry.system_attrs)  # its own run's
    assert TrialRecord.from_trial(retry) == TrialRecord(warm_start=True)
    RetryOnce()(st, st.trials[1])  # a retry that dies too is not retried again
    assert len(st.trials) == 2


def test_a_worker_whose_trial_another_failed_goes_on(tmp_path):
    """A worker stalled past the grace period finds its trial failed by another (who
    queued the retry): it warns and runs its next trial instead of crashing."""
    url = f"sqlite:///{tmp_path}/s.db"
    st = optuna.create_study(storage=url, study_name=STUDY, direction="maximize")
    other = optuna.storages.RDBStorage(url)  # another process's handle on the study

    def objective(trial):
        worker.started(trial)
        if trial.number == 0:  # what fail_stale_trials does from another process
            other.set_trial_state_values(trial_id(other, st, trial.number), TrialState.FAIL)
        return 1.0

    with Worker(st, url, budget=3) as worker, pytest.warns(RuntimeWarning, match="trial 0 was marked failed"):
        worker.optimize(objective, catch=(Exception,))
    assert [t.state for t in st.trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]


def test_a_grid_ends_when_every_point_is_measured_once_a_failed_point_s_retry_has_run(tmp_path):
    """The grid sampler counts a failed point as seen; the retry queued for it still runs,
    and then the worker stops, budget or not."""
    url = f"sqlite:///{tmp_path}/s.db"
    st = optuna.create_study(storage=url, study_name=STUDY, direction="maximize",
                             sampler=optuna.samplers.GridSampler({"x": [1, 2, 3]}, seed=0))

    def objective(trial):
        worker.started(trial)
        x = trial.suggest_int("x", 1, 3)
        if trial.number == 2:  # the grid's last point fails, and is queued again
            st.enqueue_trial({"x": x})
            raise RuntimeError("killed")
        return float(x)

    with Worker(st, url, budget=10) as worker:
        worker.optimize(objective, catch=(RuntimeError,))
    states = [t.state for t in st.trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert sorted(t.params["x"] for t in st.trials if t.state == TrialState.COMPLETE) == [1, 2, 3]


def test_second_sqlite_writer_fails_at_once_pointing_to_postgresql(tmp_path):
    storage = f"sqlite:///{tmp_path}/studies/{STUDY}.db"
    with StudyLock(storage, STUDY, "writer") as lock:
        assert lock.acquire(blocking=False)
        proc = spawn(tmp_path, storage, small_trace(tmp_path), budget=2)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.startswith("tuner:")]
    assert len(lines) == 1 and "one writer" in lines[0] and "postgresql://" in lines[0], err


@pytest.mark.postgres
def test_two_workers_queueing_the_next_trial_at_once_queue_one(pg_url):  # noqa: F811
    """A worker queues the next trial (a proposal of the simulator, or exploration after
    a repeat) when the budget has room and none is queued. Two workers doing that at once
    both saw room and left a WAITING trial in a finished study; the check and the enqueue
    now hold the study's budget lock."""
    import threading

    url = driver_url(pg_url)
    optuna.create_study(study_name=STUDY, storage=url)
    barrier = threading.Barrier(2, timeout=30)

    def queue(x: int) -> None:
        st = optuna.load_study(study_name=STUDY, storage=url)
        with Worker(st, pg_url, budget=1) as worker:
            barrier.wait()  # both ask at once
            with worker.budget_guard():
                if not st.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                    time.sleep(0.5)  # the window in which the other worker looked too
                    st.enqueue_trial({"x": x})

    threads = [threading.Thread(target=queue, args=(x,)) for x in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [t.state for t in load(pg_url).trials] == [TrialState.WAITING]


@pytest.mark.postgres
def test_a_trial_that_samples_a_configuration_late_waits_for_the_twin_measuring_it(pg_url):  # noqa: F811
    """Trial 0 is created first but samples its parameters after trial 1 has sampled the
    same ones and started measuring them: trial 0 waits for trial 1 (it used to wait for
    lower-numbered twins only, and both measured the configuration)."""
    import threading

    st = optuna.create_study(study_name=STUDY, storage=driver_url(pg_url), direction="maximize")
    for _ in range(2):  # two trials with one configuration, as two workers' samplers may draw
        st.enqueue_trial({"x": 3})
    early, late = st.ask(), st.ask()
    with Worker(st, pg_url, budget=4) as worker:
        worker.poll_s = 0.1
        late.suggest_int("x", 0, 9)  # the higher number samples first ...
        worker.wait_for_twin(late)   # ... finds nobody measuring x = 3 and goes on
        early.suggest_int("x", 0, 9)
        assert early.params == late.params == {"x": 3}
        waiter = threading.Thread(target=worker.wait_for_twin, args=(early,))
        waiter.start()
        waiter.join(timeout=1.5)
        assert waiter.is_alive(), "trial 0 measured the configuration trial 1 is measuring"
        st.tell(late, 1.0)
        waiter.join(timeout=30)
        assert not waiter.is_alive()
    # trial 0 claimed the configuration once its twin was done (then copies its result)
    assert {t.number: t.system_attrs.get(MEASURING) for t in load(pg_url).trials} == {0: True, 1: True}


@pytest.mark.postgres
@pytest.mark.slow
def test_four_workers_share_one_budget(tmp_path, pg_url):  # noqa: F811
    trace = small_trace(tmp_path)
    procs = [spawn(tmp_path, pg_url, trace) for _ in range(4)]
    stderr = {}
    for p in procs:
        out, stderr[p.pid] = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[p.pid][-2000:]
    trials = load(pg_url).get_trials(deepcopy=False)
    assert not any("confirm_of" in t.user_attrs for t in trials)  # the repeats are the companion's
    # one worker confirmed the winner (the others found the lock taken)
    assert len({t.user_attrs["pid"] for t in repeats(load(pg_url), driver_url(pg_url))}) <= 1
    states = collections.Counter(t.state for t in trials)
    # exactly the budget; a FAIL only from a worker stalled past the grace period, retried once
    assert budget_used(load(pg_url), shared=True) == (BUDGET, 0)
    assert set(states) <= {TrialState.COMPLETE, TrialState.FAIL}, states
    unretried = sum(1 for t in trials if t.state == TrialState.FAIL and "retry_of" in t.user_attrs)
    # copies of a configuration measured before (``repeat_of``) take no slot up to FREE_COPIES
    measured = sum(1 for t in trials if t.state == TrialState.COMPLETE and not is_copy(t))
    assert measured + copy_slots(load(pg_url)) == BUDGET - unretried, states
    check_failures(trials, stderr)
    pids = {p.pid for p in procs}
    assert all(t.user_attrs.get("pid") in pids and t.user_attrs.get("host") for t in trials)
    assert all(t.user_attrs["worker"] == f"{t.user_attrs['host']}:{t.user_attrs['pid']}" for t in trials)
    assert len({t.user_attrs["pid"] for t in trials}) >= 2  # the work was shared
    check_no_double_evaluation(trials)


@pytest.mark.postgres
@pytest.mark.slow
def test_a_worker_killed_mid_trial_is_failed_by_heartbeat_and_retried_once(tmp_path, pg_url):  # noqa: F811
    trace = small_trace(tmp_path)
    procs = {p.pid: p for p in (spawn(tmp_path, pg_url, trace) for _ in range(4))}
    victim = None
    deadline = time.monotonic() + 180
    while victim is None and time.monotonic() < deadline:
        time.sleep(0.3)
        gone = [p for p in procs.values() if p.poll() is not None]
        assert not gone, f"a worker exited before one was caught mid-trial: {gone[0].communicate()[1][-2000:]}"
        try:
            trials = load(pg_url).get_trials(deepcopy=False)
        except KeyError:  # the study is not created yet
            continue
        done_before = [t for t in trials if t.state == TrialState.COMPLETE]
        knobs = max((len(t.params) for t in done_before), default=0)
        running = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("pid") in procs
                   and len(t.params) == knobs]  # its configuration drawn: it is running it
        if len(done_before) >= 5 and running:
            pid = running[0].user_attrs["pid"]
            os.kill(pid, signal.SIGSTOP)  # freeze it, then make sure its trial is still running
            frozen = load(pg_url).trials[running[0].number]
            if frozen.state == TrialState.RUNNING:
                victim = frozen
                os.kill(pid, signal.SIGKILL)
            else:  # it finished between our look and the stop: let it go on, look again
                os.kill(pid, signal.SIGCONT)
    assert victim is not None, "no trial was caught running"
    stderr = {}
    for pid, p in procs.items():
        out, stderr[pid] = p.communicate(timeout=240)
        if pid == victim.user_attrs["pid"]:
            assert p.returncode == -signal.SIGKILL
        else:
            assert p.returncode == 0, stderr[pid][-2000:]
    trials = load(pg_url).get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    # no finished trial lost: each one finished before the kill is still there, unchanged
    assert all(by_number[t.number].state == TrialState.COMPLETE and by_number[t.number].value == t.value
               for t in done_before)
    # the killed worker's trial was failed by the others and its configuration ran once more
    assert by_number[victim.number].state == TrialState.FAIL
    retries = [t for t in trials if t.user_attrs.get("retry_of") == victim.number]
    assert len(retries) == 1
    assert retries[0].params == by_number[victim.number].params == victim.params and retries[0].user_attrs["pid"] != victim.user_attrs["pid"]  # noqa: E501
    if retries[0].state == TrialState.COMPLETE:  # else its worker stalled too: check_failures holds it to that
        assert retries[0].system_attrs["constraints"] == [retries[0].user_attrs["constraint"]]
    # the study completed: the budget is used exactly, nothing left running or waiting; any
    # other FAIL is a live worker's that stalled past the grace period, retried once
    assert budget_used(load(pg_url), shared=True) == (BUDGET, 0)
    states = collections.Counter(t.state for t in trials)
    assert set(states) == {TrialState.COMPLETE, TrialState.FAIL}, states
    unretried = sum(1 for t in trials if t.state == TrialState.FAIL and "retry_of" in t.user_attrs)
    # copies of a configuration measured before (``repeat_of``) take no slot up to FREE_COPIES
    measured = sum(1 for t in trials if t.state == TrialState.COMPLETE and not is_copy(t))
    assert measured + copy_slots(load(pg_url)) == BUDGET - unretried, states
    check_failures(trials, stderr, dead=frozenset({victim.user_attrs["pid"]}))
    check_no_double_evaluation(trials)

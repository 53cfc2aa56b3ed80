"""Unattended runs survive the faults of a shared host (tests/faults/scenarios.py stages
each with real processes; ``python benchmarks/faults.py`` prints them as a table)."""
from __future__ import annotations

import signal

import pytest
import scenarios as sc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_stops_the_trial_and_its_server_and_the_rerun_measures_every_configuration(tmp_path, sig):
    o = sc.stop_signal(tmp_path, sig)
    assert o.details["code"] == {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}[sig], o.details
    assert sc.one_line(o.details["stderr"]) and "interrupted by" in o.details["stderr"], o.details["stderr"]
    assert o.left == 0                                      # its server stopped with it
    assert o.details["interrupted"] == 1                    # the trial in progress: FAIL 'interrupted'
    assert o.details["rerun_code"] == 0, o.details["rerun_stderr"]
    assert len(o.details["counts"]) == sc.GRID and max(o.details["counts"].values()) == 1  # each config once
    assert o.after == sc.GRID and o.ok, o


def test_sigkill_leaves_no_server_and_the_rerun_repairs_the_study(tmp_path):
    o = sc.sigkill(tmp_path)
    assert o.left == 0, "the server outlived a SIGKILLed tuner"
    assert "left RUNNING" in o.details["rerun_stderr"]
    assert len(o.details["counts"]) == sc.GRID and o.ok, o


@pytest.mark.host_wide  # the server it leaves is stale to every run on the host
def test_a_server_left_by_a_dead_run_is_stopped_by_the_next_run_and_no_bystander_is_touched(tmp_path):
    o = sc.stale_server(tmp_path)
    assert o.ok, o


def test_a_foreign_server_on_the_port_is_never_measured_nor_killed(tmp_path):
    o = sc.foreign_server(tmp_path)
    assert o.details["hits"] == [] and o.ok, o


def test_a_port_taken_before_the_bind_is_retried_on_another_port(tmp_path):
    assert sc.port_taken(tmp_path).ok


def test_a_wrong_vllm_cmd_stops_before_anything_is_written(tmp_path):
    o = sc.bad_command(tmp_path)
    assert o.ok, o.details


def test_a_rejected_flag_is_an_environment_fault_not_a_bad_configuration(tmp_path):
    o = sc.rejected_flag(tmp_path)
    assert o.before == 0 and o.ok, o


def test_an_unknown_gpu_is_bad_input_with_its_line(tmp_path):
    o = sc.unknown_gpu(tmp_path)
    assert o.ok, o.details


def test_timeout_bounds_a_hung_start(tmp_path):
    o = sc.hung_start(tmp_path)
    assert o.ok, o


def test_startup_timeout_is_a_flag(tmp_path):
    o = sc.startup_timeout(tmp_path)
    assert o.ok, o


def test_a_full_disk_is_one_line_and_the_study_stays_intact(tmp_path):
    o = sc.disk_full(tmp_path)
    if o is None:
        pytest.skip("this machine does not let the tests mount a tmpfs (needs root); "
                    "test_free_space_is_checked_before_each_trial covers the check without one")
    assert o.ok, o.details


def test_free_space_is_checked_before_each_trial(tmp_path, monkeypatch):
    """Without a tmpfs: a disk that reports less than a megabyte free stops the search
    cleanly before the next trial, one line naming the study file."""
    import shutil
    from collections import namedtuple

    from tuner.core.errors import EnvironmentFault
    from tuner.search import run_search
    from tuner.space import parse_space

    space = parse_space(sc.SPACE, path="space.yaml").bind(parse_space(sc.SPACE).deployment, 28)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(EnvironmentFault) as err:
        run_search(space, budget=2, storage=f"sqlite:///{tmp_path}/s.db", study="s")
    assert err.value.kind == "disk_full" and f"{tmp_path}/s.db" in str(err.value) and "free space" in str(err.value)


@pytest.mark.host_wide  # the server it leaves behind the wrapper is stale to every run on the host
def test_sigkill_behind_a_wrapper_that_does_not_exec_leaves_no_server(tmp_path):
    o = sc.wrapper_sigkill(tmp_path)
    assert o.left == 0, "the server outlived a SIGKILLed tuner behind its launcher"
    assert o.ok, o


@pytest.mark.parametrize("sampler", ["grid", "tpe"])
def test_a_server_killed_from_outside_once_is_measured_again(tmp_path, sampler):
    o = sc.killed_from_outside(tmp_path, 1, sampler)
    assert o.details["killed"] and o.details["code"] == 0, o
    assert o.ok, o


def test_a_server_killed_from_outside_twice_in_a_row_stops_the_run(tmp_path):
    o = sc.killed_from_outside(tmp_path, 2)
    assert o.details["code"] == 2 and o.ok, o


@pytest.mark.parametrize("times", [1, 2])
def test_a_kill_is_told_by_the_launchers_report_even_when_it_comes_seconds_late(tmp_path, times):
    """A launcher that cleans up for 4 s before it reports its server's SIGKILL (as a busy
    host delays any launcher): the kill is still the machine's, not a disruption for the referee."""
    o = sc.killed_from_outside(tmp_path, times, cleanup_s=4)
    assert o.details["code"] == (0 if times == 1 else 2) and o.details["env_faults"] == times, o
    assert o.ok, o


def test_vllm_serve_with_flags_gets_the_model_first_and_a_refusal_before_the_engine_is_the_machines(tmp_path):
    o = sc.positional_model(tmp_path)
    assert o.ok, o.details


def test_timeout_starts_no_trial_that_cannot_finish_and_exits_124(tmp_path):
    o = sc.window(tmp_path)
    assert o.details["code"] == 124 and o.details["cut"] == 0, o
    assert o.ok, o


def test_timeout_starts_no_confirmation_repeat_that_cannot_finish_and_exits_124(tmp_path):
    o = sc.confirm_window(tmp_path)
    assert o.details["code"] == 124 and o.details["cut"] == 0, o
    assert o.details["rerun"] == 0, o
    assert o.ok, o

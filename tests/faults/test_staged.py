"""Issue 48's faults, staged as sites stage them (tests/faults/staged.py, staged_ops.py):
launchers that put the server out of tuner's process group, disrupted replays, failures
judged by experiment, studies that must not vanish, nightly runs, credentials and inputs.
``python benchmarks/faults.py`` prints the same scenarios as a table."""
from __future__ import annotations

import pytest
import staged
import staged_ops

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize("kind", ["timeout", "daemon"])
def test_servers_behind_site_launchers_are_stopped_and_never_taken_for_foreign_gpu_holders(tmp_path, kind):
    o = staged.launcher(tmp_path, kind)
    assert o.left == 0, "a server outlived its trial or the run"
    assert o.details["code"] == 0 and "gpu_busy" not in o.details["stderr"], o.details["stderr"]
    assert o.details["peak"] == 1 and o.ok, o


@pytest.mark.parametrize("scenario", [staged.paused, staged.terminated], ids=["sigstop_20s", "sigterm"])
def test_a_disrupted_replay_is_measured_again_and_never_stored(tmp_path, scenario):
    o = scenario(tmp_path)
    assert o.details["caught"], "the replay was never caught mid-way"
    assert o.details["seen"], "the disruption went unseen"
    assert not o.details["slow"] and not o.details["disconnects"] and not o.details["infeasible"], o.details
    assert o.details["code"] == 0 and o.ok, o


def test_a_warm_up_503_is_waited_out(tmp_path):
    o = staged.warming_up(tmp_path)
    assert o.details["failed"] == [] and o.ok, o


def test_a_failure_naming_a_knobs_value_is_the_configurations(tmp_path):
    o = staged.knob_failure(tmp_path)
    assert o.details["blamed"] == [(256, False), (256, True), (512, False), (512, True)], o.details
    assert o.details["code"] == 0 and o.ok, o


def test_a_failure_with_a_per_start_id_is_the_machines(tmp_path):
    o = staged.hexid_failure(tmp_path)
    assert o.details["stored"] == [] and o.details["code"] == 2, o.details
    assert o.ok, o


def test_transient_crashes_in_the_search_and_the_race_are_never_a_configurations(tmp_path):
    o = staged.transient(tmp_path)
    assert "crash" in o.details["phases"]["search"] and "crash" in o.details["phases"]["race"], o.details["phases"]
    assert o.details["blamed"] == [], o.details
    assert o.ok, o


def test_a_study_file_deleted_mid_study_is_saved_and_named(tmp_path):
    o = staged.study_deleted(tmp_path)
    assert o.details["code"] == 2 and "deleted" in o.details["stderr"], o.details
    assert o.ok, o


def test_nightly_names_an_empty_or_foreign_study_file(tmp_path):
    o = staged.broken_nightly_study(tmp_path)
    assert o.ok, o.details


def test_a_study_file_at_the_file_size_limit_is_named(tmp_path):
    o = staged.efbig(tmp_path)
    assert "file size limit" in o.details["stderr"] and o.ok, o.details


def test_a_quiet_night_is_a_changed_workload_not_a_regression(tmp_path):
    o = staged_ops.quiet_night(tmp_path)
    assert o.details["codes"] == (0, 0), o.details
    assert o.ok, o.details["out"]


def test_a_password_in_the_storage_url_shows_in_no_output_and_no_file(tmp_path):
    o = staged_ops.password_everywhere(tmp_path)
    if o is None:
        pytest.skip("no PostgreSQL server can be started here (needs root and the server binaries)")
    assert o.details["leaks"] == [], o.details["leaks"]
    assert o.ok, o.details


def test_a_negative_seed_is_one_line(tmp_path):
    o = staged_ops.bad_seed(tmp_path)
    assert o.ok, o.details


def test_a_trace_too_large_for_the_window_is_sampled(tmp_path):
    o = staged_ops.huge_trace(tmp_path)
    assert o.after >= 1 and o.ok, o.details


def test_an_impossible_request_is_named_at_load(tmp_path):
    o = staged_ops.impossible_request(tmp_path)
    assert o.ok, o.details


def test_an_endpoint_study_prints_no_serve_command(tmp_path):
    o = staged_ops.endpoint_command(tmp_path)
    assert o.ok, o.details

"""What an endpoint answers is judged strictly, and its credentials stay in memory: bad
answers (garbage streams, all-429, all-500, a stream that hangs) fail every load with the
error kinds counted and shown, never feasible; an API key from a file, the environment
or the URL is sent and found in no study file, output or report. Real processes on
loopback (tests/faults/scenarios.py; tests/replay/bad_server.py answers)."""
from __future__ import annotations

import pytest
import scenarios as sc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize(("scenario", "kind"), [
    (sc.garbage_stream, "stream_error"),
    (sc.all_429, "http_429"),
    (sc.all_500, "http_500"),
    (sc.hang_mid_stream, "timeout"),
], ids=["garbage", "all_429", "all_500", "hang"])
def test_bad_answers_fail_every_trial_with_the_error_kinds_named(tmp_path, scenario, kind):
    o = scenario(tmp_path)
    assert o.details["code"] == 3, o.details
    err = o.details["stderr"]
    assert sc.one_line(err) and f"{kind} x" in err and "failed at" in err and "nan" not in err, err
    assert all(e and set(e) == {kind} for e in o.details["errors"]), o.details["errors"]
    assert kind in o.details["shown"]["errors_total"]           # tuner studies show --output json
    assert o.left == 0 and o.ok, o


def test_a_key_in_the_url_is_used_and_never_stored_printed_or_reported(tmp_path):
    o = sc.key_in_url(tmp_path)
    code, err = o.details["wrong"]
    assert code == 2 and sc.one_line(err) and "answered 401" in err and "sk-wrong" not in err, err
    assert o.details["code"] == 0, o.details["stderr"]
    assert o.details["leaks"] == [], o.details["leaks"]        # db, -wal, report.html, every output
    assert o.ok, o


def test_an_api_key_from_a_file_or_the_environment_is_sent_and_never_stored(tmp_path):
    o = sc.api_key(tmp_path)
    code, err = o.details["no_key"]
    assert code == 2 and sc.one_line(err) and "--api-key-file" in err and "OPENAI_API_KEY" in err, err
    assert o.details["file"][0] == 0 and o.details["env"][0] == 0, o.details
    assert o.details["leaks"] == [], o.details["leaks"]
    assert o.ok, o


@pytest.mark.parametrize("behaviour", ["refused", "reset", "hold"])
def test_an_endpoint_that_cannot_be_talked_to_is_an_endpoint_fault_exit_5(tmp_path, behaviour):
    o = sc.endpoint_down(tmp_path, behaviour)
    err = o.details["stderr"]
    assert o.details["code"] == 5 and sc.one_line(err) and "cannot write the study" not in err, err
    assert o.ok, o


def test_an_endpoint_killed_mid_replay_stops_the_run_and_stores_nothing_as_the_configurations(tmp_path):
    o = sc.endpoint_dies(tmp_path)
    assert o.details["code"] == 5 and o.details["kinds"] == ["environment"], o.details
    assert o.details["rerun"][0] == 0, o.details["rerun"]
    assert o.ok, o


def test_an_endpoint_whose_streams_claim_tokens_that_never_streamed_is_a_bad_stream_not_a_trial(tmp_path):
    o = sc.instant_stream(tmp_path)
    assert o.details["code"] == 5 and "did not arrive as its usage claims" in o.details["stderr"], o.details
    assert o.ok, o

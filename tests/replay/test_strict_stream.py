"""Strict stream parsing: a request only counts when its whole answer is a well-formed
stream; anything else is an error of its kind (against bad_server.py, a real process)."""
from __future__ import annotations

import numpy as np
import pytest
from stand_ins import start_bad, stop_stub

from tuner.core.errors import BackendError, InputError
from tuner.replay import replay
from tuner.serving.load import Concurrency
from tuner.traffic.workload import Workload


def _workload(n: int = 8, out: int = 6) -> Workload:
    return Workload(arrival_s=np.zeros(n), prompt_tokens=np.full(n, 20), output_tokens=np.full(n, out))


def test_a_well_formed_stream_counts_with_the_forced_tokens(bad):
    r = replay(bad, _workload(), Concurrency(4), model="ok", metrics=False)
    assert r.error == [None] * 8 and (r.output_tokens == 6).all() and (r.prompt_tokens == 20).all()
    assert r.error_counts() == {} and r.summary()["error_rate"] == 0.0
    assert not any(k.startswith("errors_") for k in r.summary())


@pytest.mark.parametrize(("mode", "kind", "words"), [
    ("garbage", "stream_error", "not JSON"),
    ("no_done", "stream_error", "[DONE]"),
    ("no_usage", "stream_error", "usage"),
    ("overcount", "stream_error", "11 output tokens, 6 were forced"),
    ("error_chunk", "stream_error", "engine dead"),
    ("not_sse", "stream_error", "not SSE"),
    ("short", "short_output", "3 of the 6"),
    ("http_429", "http_429", "rate limit reached"),
    ("http_500", "http_500", "internal server error"),
    ("reset", "disconnect", ""),
])
def test_a_bad_answer_is_an_error_of_its_kind_and_earns_no_tokens(bad, mode, kind, words):
    r = replay(bad, _workload(), Concurrency(4), model=mode, metrics=False)
    assert r.error == [kind] * 8
    assert r.error_counts() == {kind: 8}
    s = r.summary()
    assert s["error_rate"] == 1.0 and s[f"errors_{kind}"] == 8.0
    assert s["completed"] == 0 and np.isnan(s["ttft_p95_s"])
    assert s["tokens_per_s"] == 0 and s["output_tokens_per_s"] == 0  # garbage earns nothing
    assert words in r.error_detail[kind]


def test_garbage_in_a_chat_stream_is_an_error_too(bad):
    assert replay(bad, _workload(4), Concurrency(2), model="ok", api="chat", metrics=False).error == [None] * 4
    assert replay(bad, _workload(4), Concurrency(2), model="garbage", api="chat",
                  metrics=False).error == ["stream_error"] * 4


@pytest.fixture
def own_bad():
    """Start a bad-answer stand-in with its own flags; stopped when the test ends."""
    procs = []

    def start(*args: str) -> str:
        proc, url = start_bad(*args)
        procs.append(proc)
        return url

    yield start
    for proc in procs:
        stop_stub(proc)


def test_a_server_that_hangs_mid_stream_times_out(own_bad):
    r = replay(own_bad("--mode", "hang"), _workload(3), Concurrency(3), timeout_s=0.5, metrics=False)
    assert r.error == ["timeout"] * 3 and "0.5 s" in r.error_detail["timeout"]


def test_the_api_key_goes_as_a_bearer_header_and_never_into_the_result(own_bad):
    import json
    import urllib.request

    url = own_bad("--key", "sk-test-12345678")
    with pytest.raises(BackendError, match="wants an API key"):  # no key: /v1/models answers 401
        replay(url, _workload(2), Concurrency(1), metrics=False)
    r = replay(url, _workload(2), Concurrency(1), model="ok", metrics=False)
    assert r.error == ["http_401"] * 2
    with pytest.raises(BackendError, match="refused the credentials"):
        replay(url, _workload(2), Concurrency(1), metrics=False, api_key="sk-wrong-12345678")
    r = replay(url, _workload(4), Concurrency(2), api_key="sk-test-12345678")
    assert r.error == [None] * 4
    assert "sk-test" not in repr(r.server) and "sk-test" not in repr(r.error_detail)
    # credentials written into the URL are sent as the header they meant, and leave the URL
    host = url.removeprefix("http://")
    r = replay(f"http://me:sk-test-12345678@{host}", _workload(2), Concurrency(1))
    assert r.error == [None] * 2 and r.server["endpoints"] == [url]
    with urllib.request.urlopen(url + "/debug/auth", timeout=5) as resp:
        seen = json.load(resp)
    assert seen["refused"] == 1 + 2 + 1 and seen["ok"] == 1 + 4 + 1 + 2


def test_a_key_in_a_query_string_or_twice_is_refused_without_showing_it():
    with pytest.raises(InputError) as err:
        replay("http://127.0.0.1:9/v1?api_key=sk-secret-123", _workload(1), Concurrency(1), model="m")
    assert "query string" in str(err.value) and "sk-secret" not in str(err.value)
    with pytest.raises(InputError) as err:
        replay("http://u:sk-secret-123@127.0.0.1:9", _workload(1), Concurrency(1), model="m", api_key="k")
    assert "carries credentials" in str(err.value) and "sk-secret" not in str(err.value)


def test_sse_comments_and_other_fields_are_sse_anything_else_is_not():
    from tuner.replay.stream import _Bad, _payload

    assert _payload(b"data: [DONE]") == b"[DONE]"
    assert _payload(b": keep-alive") is None                     # a comment
    assert _payload(b"event: message\nid: 7\ndata: {}") == b"{}"  # other fields are ignored
    assert _payload(b"data: {\"a\":\ndata: 1}") == b"{\"a\":\n1}"  # data lines are joined
    with pytest.raises(_Bad, match="not SSE"):
        _payload(b"{\"choices\": []}")


def test_error_counts_leave_out_what_a_stop_left_unfinished():
    from tuner.serving.result import RunResult, describe_errors

    nan = np.full(6, np.nan)
    r = RunResult(send_s=nan, ttft_s=nan, e2e_s=nan, prompt_tokens=np.zeros(6, int), output_tokens=np.zeros(6, int),
                  error=[None, "http_429", "http_429", "timeout", "not_sent", "cancelled"], duration_s=1.0)
    assert r.error_counts() == {"http_429": 2, "timeout": 1}
    assert r.error_counts(unfinished=True) == {"http_429": 2, "cancelled": 1, "not_sent": 1, "timeout": 1}
    assert describe_errors(r.error_counts()) == "http_429 x2, timeout x1"
    assert describe_errors({"a": 1, "b": 2, "c": 3}, limit=2) == "c x3, b x2, +1 more kinds"
    assert r.summary()["errors_http_429"] == 2.0 and "errors_not_sent" not in r.summary()


def test_one_instant_chunk_claiming_every_forced_token_is_a_bad_stream(bad):
    """The 253,692 tok/s stream: usage claims 2,000 forced tokens, one chunk brought them
    at once (a decoder needs at least 500 ms for them, so a busy machine does not blur it)."""
    from tuner.replay.client import bad_stream_fault

    r = replay(bad, _workload(4, out=2000), Concurrency(2), model="instant", metrics=False)
    assert r.error == ["bad_stream"] * 4 and r.summary()["tokens_per_s"] == 0
    assert "1 content chunk(s)" in r.error_detail["bad_stream"] and "2000" in r.error_detail["bad_stream"]
    kind, cause = bad_stream_fault(r)
    assert kind == "bad_stream" and "4 of 4 streams" in cause


@pytest.mark.parametrize("mode", ["grouped", "spec", "merged"])
def test_tokens_grouped_as_vllm_groups_them_are_plausible(bad, mode):
    """vLLM under high load (1.5 tokens a chunk), speculative decoding (5 a chunk) and an API
    server that fell behind (one token, then the other 299 merged into one chunk once decoded:
    vLLM 0.26.0 at 256 users on an H200 sent 2 chunks for 444 tokens) are measured as they
    are, at either length."""
    from tuner.replay.client import bad_stream_fault

    for out in (6, 300):
        r = replay(bad, _workload(4, out=out), Concurrency(2), model=mode, metrics=False)
        assert r.error == [None] * 4 and (r.output_tokens == out).all(), r.error_detail
        assert bad_stream_fault(r) is None

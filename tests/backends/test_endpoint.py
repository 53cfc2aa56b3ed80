"""The endpoint backend replays against a server it did not start, and leaves it running."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from tuner.backends.endpoint import EndpointBackend
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency
from tuner.traffic.workload import Workload


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tuner.sim.server", "qwen2.5-7b", "--port", str(port),
                             "--max-model-len", "4096", "--speed", "20"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_replays_against_a_running_server_and_leaves_it_up(server):
    backend = EndpointBackend([server + "/v1"])
    assert backend.precheck(Deployment(), ServeConfig()) == {}
    w = Workload(arrival_s=np.zeros(12), prompt_tokens=np.full(12, 100), output_tokens=np.full(12, 8))
    with backend.start(Deployment(), ServeConfig()) as inst:
        assert inst.info["model_name"] == "qwen2.5-7b" and inst.info["max_model_len"] == 4096
        assert inst.info["num_gpu_blocks"] > 0 and inst.info["startup_s"] == 0.0
        r = inst.run(w, Concurrency(4))
    assert r.error == [None] * 12 and (r.output_tokens == 8).all()
    assert urllib.request.urlopen(server + "/health", timeout=2).status == 200


def test_a_url_that_refuses_connections_is_an_endpoint_fault_naming_it():
    from tuner.core.errors import EndpointFault

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EndpointFault) as err:
        EndpointBackend(f"http://127.0.0.1:{port}").start(Deployment(), ServeConfig())
    assert err.value.kind == "refused" and err.value.exit_code == 5
    assert f"http://127.0.0.1:{port}/v1/models" in str(err.value) and "connection refused" in str(err.value)


@pytest.mark.parametrize(("behaviour", "kind", "words"), [("reset", "reset", "connection reset"),
                                                          ("hold", "timeout", "no answer in time")])
def test_a_url_that_resets_or_holds_the_connection_is_an_endpoint_fault(behaviour, kind, words):
    """A real process on loopback that accepts and resets (SO_LINGER 0) or accepts and never
    answers: the one line names the URL and the cause."""
    from tuner.core.errors import EndpointFault

    stub = subprocess.Popen([sys.executable, str(STUB), behaviour], stdout=subprocess.PIPE, text=True)
    try:
        port = int(stub.stdout.readline())
        backend = EndpointBackend(f"http://127.0.0.1:{port}")
        backend._probe_s = 1.0
        with pytest.raises(EndpointFault) as err:
            backend.preflight(Deployment())
        assert err.value.kind == kind and words in str(err.value) and f"127.0.0.1:{port}" in str(err.value)
    finally:
        stub.kill()
        stub.wait(timeout=10)


STUB = __import__("pathlib").Path(__file__).resolve().parents[1] / "faults" / "tcp_stub.py"


BAD = __import__("pathlib").Path(__file__).resolve().parents[1] / "replay" / "bad_server.py"
KEY = "sk-endpoint-test-0123456789"


@pytest.fixture
def keyed():
    """The bad-answer stand-in (tests/replay/bad_server.py) demanding KEY; its base URL."""
    from tuner.backends.local_server import free_port, start_local_server

    port = free_port()
    proc, url = start_local_server([sys.executable, str(BAD), "--port", str(port), "--key", KEY], port,
                                   what="bad server")
    try:
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_the_key_is_checked_before_a_study_and_sent_with_every_request(keyed):
    from tuner.core.errors import InputError

    with pytest.raises(InputError) as err:  # no key: one line naming the URL, saying what to do
        EndpointBackend(keyed).preflight(Deployment())
    assert f"{keyed}/v1/models answered 401" in str(err.value) and "--api-key-file" in str(err.value)
    with pytest.raises(InputError, match="refused the credentials"):
        EndpointBackend(keyed, api_key="sk-wrong-0123456789").preflight(Deployment())
    backend = EndpointBackend(keyed, api_key=KEY)
    backend.preflight(Deployment())
    assert KEY not in repr(backend) and KEY not in repr(backend._replay)
    w = Workload(arrival_s=np.zeros(6), prompt_tokens=np.full(6, 30), output_tokens=np.full(6, 5))
    with backend.start(Deployment(), ServeConfig()) as inst:
        assert inst.info["model_name"] == "ok" and KEY not in repr(inst.info)
        r = inst.run(w, Concurrency(3))
    assert r.error == [None] * 6 and KEY not in repr(r.server)


def test_credentials_in_the_url_are_used_and_masked_in_every_message(keyed):
    from tuner.core.errors import EndpointFault, InputError

    host = keyed.removeprefix("http://")
    backend = EndpointBackend(f"http://user:{KEY}@{host}/v1")
    assert backend.urls == [keyed]  # the credentials left the URL for a header
    backend.preflight(Deployment())
    with backend.start(Deployment(), ServeConfig()) as inst:
        assert KEY not in repr(inst.info)
    with pytest.raises(InputError) as err:
        EndpointBackend(f"http://user:sk-wrong-0123456789@{host}").preflight(Deployment())
    assert "sk-wrong" not in str(err.value) and "http://***@" not in str(err.value)  # the URL shown has none
    with pytest.raises(EndpointFault) as err:  # an unreachable URL with a key in it
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        EndpointBackend(f"http://user:{KEY}@127.0.0.1:{port}").preflight(Deployment())
    assert KEY not in str(err.value) and "connection refused" in str(err.value)

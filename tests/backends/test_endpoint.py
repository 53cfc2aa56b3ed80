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
from tuner.config import Deployment, ServeConfig
from tuner.errors import BackendError
from tuner.load import Concurrency
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


def test_unreachable_url_is_a_backend_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendError, match="did not answer"):
        EndpointBackend(f"http://127.0.0.1:{port}").start(Deployment(), ServeConfig())

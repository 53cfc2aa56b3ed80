"""A vLLM server tuner starts leaves nothing in the temporary folder once it stops.

vLLM binds its ZMQ ``ipc://`` sockets (API server <-> engine core) at
``$VLLM_RPC_BASE_PATH/<uuid4>``, which defaults to ``tempfile.gettempdir()`` (``vllm/envs.py``),
and the CPU build writes a ``vllm_dist_*`` rendezvous file there; a server that is stopped
rather than shut down leaves them behind (the live tier left ~35 zero-byte sockets in /tmp).
The stand-in below does what vLLM does with the temporary folder, then serves as
``tuner sim-serve``: the launcher must give each server a folder of its own and remove it."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from tuner.backends.vllm import VllmBackend
from tuner.core.errors import ConfigRejected
from tuner.serving.config import Deployment, ServeConfig

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

STANDIN = '''
import os, runpy, socket, sys, tempfile, uuid
base = os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()
sockets = []
for _ in range(3):  # as vLLM's input, output and handshake ipc sockets
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(base, str(uuid.uuid4())))
    sockets.append(s)
open(os.path.join(tempfile.gettempdir(), "vllm_dist_" + uuid.uuid4().hex), "w").close()
sys.argv = ["tuner.sim.command", *sys.argv[1:]]
runpy.run_module("tuner.sim.command", run_name="__main__", alter_sys=True)
'''


@pytest.fixture
def tmpdir_of_this_run(monkeypatch):
    """TMPDIR of this process: an empty folder, so that whatever a server leaves shows (short,
    as a site's TMPDIR is: a socket's path must fit in 107 bytes)."""
    import shutil

    folder = Path(tempfile.mkdtemp(prefix="t47-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def backend(tmp_path):
    script = tmp_path / "standin.py"
    script.write_text(STANDIN, encoding="utf-8")
    return VllmBackend(vllm_cmd=f"{sys.executable} {script} --speed 20", log_dir=tmp_path / "logs",
                       startup_timeout_s=60, stop_grace_s=5)


def test_a_stopped_server_leaves_nothing_in_the_temporary_folder(backend, tmpdir_of_this_run):
    dep = Deployment(model="qwen2.5-7b", gpu="H100-SXM", gpu_count=2)
    with backend.start(dep, ServeConfig(max_model_len=4096, replicas=2)):
        made = sorted(os.listdir(tmpdir_of_this_run))
        assert len(made) == 2, made  # a folder of its own per server, not the sockets themselves
        assert all(len(os.listdir(tmpdir_of_this_run / d)) == 4 for d in made)  # 3 sockets and the dist file
        assert all(len(str(tmpdir_of_this_run / d)) + 37 <= 107 for d in made)  # a socket path fits sockaddr_un
    assert os.listdir(tmpdir_of_this_run) == []


def test_a_server_that_refuses_its_configuration_leaves_nothing_either(backend, tmpdir_of_this_run):
    cfg = ServeConfig(max_model_len=32768, gpu_memory_utilization=0.3)
    with pytest.raises(ConfigRejected):
        backend.start(Deployment(model="qwen2.5-14b", gpu="V100-32GB-SXM2", vllm_version="0.6.3"), cfg)
    assert os.listdir(tmpdir_of_this_run) == []


def test_a_server_killed_from_outside_leaves_nothing_once_stopped(backend, tmpdir_of_this_run):
    import signal

    inst = backend.start(Deployment(model="qwen2.5-7b", gpu="H100-SXM"), ServeConfig(max_model_len=4096))
    try:
        for pgid in inst.pgids:
            os.killpg(pgid, signal.SIGKILL)  # no shutdown of its own: the sockets stay bound on disk
    finally:
        inst.close()
    assert os.listdir(tmpdir_of_this_run) == []


def test_a_temporary_folder_too_deep_for_a_socket_path_gives_way_to_tmp(monkeypatch, tmp_path):
    import shutil

    from tuner.backends.vllm_replica import server_tmpdir

    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(tempfile, "tempdir", None)
    made = server_tmpdir()
    try:
        assert made.parent == Path("/tmp") and len(str(made)) + 1 + 36 <= 107
    finally:
        shutil.rmtree(made)

"""Servers started through the launchers sites write are found by tuner's marker and
stopped on every exit path: a shell that runs the server under coreutils ``timeout`` (a
process group of its own), one that daemonizes it and follows its log (``setsid nohup``
+ ``tail -f``), one that daemonizes it and returns; and the GPU check never counts a
process of this run as a foreigner. Real processes, real signals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tuner.backends.vllm import VllmBackend
from tuner.runtime import processes
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency
from tuner.traffic.synth import default_workload

SERVE = f"{sys.executable} -m tuner sim-serve --speed 50"
LAUNCHERS = {
    "timeout": f"#!/bin/bash\ntimeout --kill-after=30s 6h {SERVE} \"$@\"\n",
    "daemon_tail": (f"#!/bin/bash\nlog=\"$PWD/server-$$.log\"\nsetsid nohup {SERVE} \"$@\" > \"$log\" 2>&1 < /dev/null &\n"  # noqa: E501
                    "tail -n +1 -f \"$log\"\n"),
    "daemon_return": f"#!/bin/bash\nsetsid nohup {SERVE} \"$@\" > /dev/null 2>&1 < /dev/null &\nexit 0\n",
}
DEP = Deployment(model="qwen2.5-7b", gpu="H100-SXM")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_processes")]


def launcher(tmp_path, kind: str) -> str:
    script = tmp_path / f"launch-{kind}.sh"
    script.write_text(LAUNCHERS[kind])
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("kind", list(LAUNCHERS))
def test_a_server_behind_a_site_launcher_serves_and_is_stopped_with_everything_it_started(tmp_path, monkeypatch,
                                                                                         kind):
    monkeypatch.chdir(tmp_path)
    backend = VllmBackend(vllm_cmd=launcher(tmp_path, kind), log_dir=tmp_path / "logs", startup_timeout_s=120,
                          stop_grace_s=5)
    inst = backend.start(DEP, ServeConfig(max_model_len=4096, max_num_seqs=16))
    token = inst.replicas[0].token
    try:
        server = inst.replicas[0].server  # what listens on its port
        assert server is not None and "sim-serve" in " ".join(server.cmdline())
        assert os.getpgid(server.pid) != inst.pgids[0]  # outside the group tuner made
        result = inst.run(default_workload(seed=0, n=8), Concurrency(2))
        assert result.error == [None] * 8
    finally:
        inst.close()
    assert processes.processes_of(token) == []  # the server, timeout, tail: all of it


def test_a_server_that_exits_mid_run_behind_a_daemonizing_launcher_is_seen_gone(tmp_path, monkeypatch):
    """The launcher (tail -f) still runs; the server it daemonized is gone: the replica has exited."""
    monkeypatch.chdir(tmp_path)
    backend = VllmBackend(vllm_cmd=launcher(tmp_path, "daemon_tail"), log_dir=tmp_path / "logs",
                          startup_timeout_s=120, stop_grace_s=5)
    with backend.start(DEP, ServeConfig(max_model_len=4096, max_num_seqs=16)) as inst:
        r = inst.replicas[0]
        assert not r.exited()
        r.server.kill()
        assert processes.processes_of(r.token) and r.proc.poll() is None  # tail -f goes on
        deadline = time.monotonic() + 10
        while not r.exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.exited()


OWNER = """\
import os, sys, time
sys.path.insert(0, {repo!r})
from tuner.backends.vllm import VllmBackend
from tuner.serving.config import Deployment, ServeConfig
b = VllmBackend(vllm_cmd={cmd!r}, log_dir={logs!r}, startup_timeout_s=120, stop_grace_s=5)
inst = b.start(Deployment(model="qwen2.5-7b", gpu="H100-SXM"), ServeConfig(max_model_len=4096, max_num_seqs=16))
print(inst.replicas[0].token, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("kind", ["timeout", "daemon_tail"])
def test_sigkill_of_tuner_stops_a_server_a_launcher_put_elsewhere(tmp_path, kind):
    """SIGKILL leaves tuner no say: its watchdog stops whatever carries its marker."""
    code = OWNER.format(repo=os.getcwd(), cmd=launcher(tmp_path, kind), logs=str(tmp_path / "logs"))
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    token = owner.stdout.readline().strip()
    assert servers_of_owner(owner.pid, token)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 40
    while servers_of_owner(owner.pid, token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not servers_of_owner(owner.pid, token)


def servers_of_owner(owner: int, token: str) -> list[psutil.Process]:
    return processes.processes_of(token, owner=owner)


def test_the_gpu_check_never_counts_a_process_of_this_run_as_a_foreigner(tmp_path, monkeypatch):
    from tuner.backends import gpu_memory

    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                            env={**os.environ, processes.MARKER_ENV: processes.marker("tok")})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in
          *query-gpu*) echo "0, GPU-0";;
          *) echo "GPU-0, {mine.pid}, python, 40960"; echo "GPU-0, {other.pid}, python, 1024";;
        esac
        """))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    try:
        foreign = gpu_memory.foreign_holders([0])
        assert [h.pid for h in foreign] == [other.pid]  # ours by its marker, though in no group of ours
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()

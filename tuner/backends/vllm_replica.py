"""One ``vllm serve`` replica as a process: :class:`_Replica` (its launcher's process
group, port, log and tuner's marker token; whether its server runs; stopping it), and
every replica this process started and has not stopped (:func:`stop_all`, the CLI's last
act on any exit).

The process tuner starts is the command of ``--vllm-cmd``: vLLM itself, or a launcher a
site wrote. A launcher may keep the server in its process group (a shell that waits), put
it in another (coreutils ``timeout`` makes a group of its own) or daemonize it (``setsid
nohup ... &``, then ``tail -f`` of its log, or an exit at once). So a replica is stopped
by its process group *and* by its marker token (:func:`tuner.runtime.processes.stop_marked`),
and its server is alive while the process listening on its port is (or, before it
listens, while the launcher runs or a process carrying its token does)."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

from tuner.backends import reaper
from tuner.backends.vllm_cpu import remove_dist_files
from tuner.runtime import processes


def server_tmpdir() -> Path:
    """A temporary folder of one server's own, its ``TMPDIR`` and ``VLLM_RPC_BASE_PATH``: vLLM
    binds its ZMQ ipc sockets at ``$VLLM_RPC_BASE_PATH/<uuid4>`` (default: the temporary folder,
    vllm/envs.py) and the CPU build its ``vllm_dist_*`` file there; a server that is stopped
    leaves them, so the folder goes with it (:meth:`_Replica.stop`). Under ``/tmp`` when the
    temporary folder's path is too long for a socket (sockaddr_un holds 107 bytes)."""
    import tempfile

    parent = tempfile.gettempdir()  # + /tuner-vllm-XXXXXXXX/ + a uuid4: 57 bytes more
    return Path(tempfile.mkdtemp(prefix="tuner-vllm-", dir=parent if len(parent) <= 50 else "/tmp"))


#: How long a launcher that waits on its server (a shell, coreutils ``timeout``) is given to
#: report the server's end: it may clean up first, and a busy host schedules it late. A
#: launcher the server is not a descendant of (it daemonized) reports nothing: not waited for.
REPORT_S = 10.0

#: Every replica this process started and has not stopped yet (see :func:`stop_all`).
_LIVE: set[_Replica] = set()


def stop_all(grace_s: float = 5.0) -> int:
    """Stop every server this process started and has not stopped, and any process left
    carrying this process's marker (the last thing the CLI does on any exit); returns how
    many replicas there were."""
    left = list(_LIVE)
    for r in left:
        r.stop(grace_s)
    processes.stop_marked(grace_s=grace_s)
    return len(left)


class _Replica:
    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path, argv: list[str], gpus: str,
                 token: str = "", port: int = 0, tmpdir: Path | None = None) -> None:
        self.proc = proc
        self.pgid = proc.pid  # start_new_session=True: the child leads its own group
        self.url = url
        self.log_path = log_path
        self.argv = argv
        self.gpus = gpus
        self.token = token
        self.port = port
        self.tmpdir = tmpdir  # its TMPDIR (vLLM's ipc sockets): removed once it is stopped
        self.server: psutil.Process | None = None  # what listens on the port, once it does
        self.reports = False  # the launcher waits on that server, so its exit code will say how it ended
        _LIVE.add(self)
        reaper.watch(self.pgid)  # stopped with this process however it ends (a wrapper that does not exec)

    def log_text(self, limit: int = 2_000_000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - limit))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def found_server(self) -> None:
        """Note the process listening on the replica's port (its server, whatever launched it)."""
        pid = processes.listener_pid(self.port)
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                self.server = psutil.Process(pid)
                self.reports = pid == self.proc.pid or self.proc.pid in {p.pid for p in self.server.parents()}

    def exited(self) -> bool:
        """The server is gone: the process that listened on the port has ended, or (before
        it listens) the launcher has ended and no process carries the replica's token."""
        if self.server is not None:
            try:
                return not self.server.is_running() or self.server.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                return True
        if self.proc.poll() is None:
            return False
        return not processes.processes_of(self.token)

    def exit_code(self) -> int | None:
        """The launcher's exit code: the server's own, or ``128+N`` for a signal from a shell
        that waits on it (given :data:`REPORT_S` to end after its server did); None while a
        launcher runs on that does not wait on the server (a daemonized server's code is not known)."""
        try:
            return self.proc.wait(timeout=REPORT_S) if self.reports else self.proc.poll()
        except subprocess.TimeoutExpired:
            return None

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # The group exists; if only our unreaped leader is left, it is a zombie.
        if self.proc.poll() is not None:
            return processes.group_alive(self.pgid)
        return True

    def stop(self, grace_s: float) -> None:
        """SIGTERM the launcher's group and every process carrying the replica's token,
        SIGKILL after ``grace_s``."""
        if self.token:
            with contextlib.suppress(OSError):
                os.killpg(self.pgid, signal.SIGTERM)
            processes.stop_marked(self.token, grace_s=grace_s)
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if not self.group_alive():
                break
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.proc.poll()
                if not self.group_alive():
                    break
                time.sleep(0.05)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if not self.group_alive() and not (self.token and processes.processes_of(self.token)):
            _LIVE.discard(self)
            reaper.forget(self.pgid)
            remove_dist_files(self.log_text())  # /tmp/vllm_dist_* our log names (vllm_cpu.py)
            if self.tmpdir is not None:
                shutil.rmtree(self.tmpdir, ignore_errors=True)

"""One ``vllm serve`` replica as a process: :class:`_Replica` (its process group, port,
log and tuner's marker token; stopping it), and every replica this process started and has
not stopped (:func:`stop_all`, the CLI's last act on any exit)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

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


#: Every replica this process started and has not stopped yet (see :func:`stop_all`).
_LIVE: set[_Replica] = set()


def stop_all(grace_s: float = 5.0) -> int:
    """Stop every server this process started and has not stopped (the last thing the
    CLI does on any exit); returns how many there were."""
    left = list(_LIVE)
    for r in left:
        r.stop(grace_s)
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
        if not self.group_alive():
            _LIVE.discard(self)
            reaper.forget(self.pgid)
            remove_dist_files(self.log_text())  # /tmp/vllm_dist_* our log names (vllm_cpu.py)
            if self.tmpdir is not None:
                shutil.rmtree(self.tmpdir, ignore_errors=True)

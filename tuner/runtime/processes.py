"""The servers tuner starts, as processes: how they are marked, found again and stopped.

Every server the vLLM backend starts runs in a process group of its own and carries the
environment variable :data:`MARKER_ENV`, ``<host>:<owner pid>:<token>`` (the owner is the
``tuner`` process that started it; the token is also the server's second
``--served-model-name``, ``tuner-<token>``, so that ``/v1/models`` proves a port answers
with the server tuner started and not another process). The marker is how tuner finds its servers, whatever launched them: a launcher that runs
the server under coreutils ``timeout`` (which puts it in a process group of its own), one
that daemonizes it (``setsid nohup ... &``, then ``tail -f`` of its log, or returns at
once) leave it outside the group tuner started, but never outside the environment it was
given. So a run stops its servers by the marker (:func:`stop_marked`: every process
carrying this process's marker, or one server's token), on every exit path, and the GPU
check never takes one of them for a foreigner (:func:`is_ours`). From the marker a later
run, or ``tuner doctor``, finds the servers whose owner is gone (a run killed with SIGKILL, a
crashed host session) and stops them. Processes without the marker are never signalled.
"""  # noqa: E501
from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass

import psutil

MARKER_ENV = "TUNER_SERVER"
#: Prefix of the served model name that carries the token.
NAME_PREFIX = "tuner-"


def marker(token: str) -> str:
    """The :data:`MARKER_ENV` value for a server of this process."""
    return f"{socket.gethostname()}:{os.getpid()}:{token}"


@dataclass(frozen=True, slots=True)
class ServerProcess:
    """A process that carries tuner's marker."""

    pid: int
    pgid: int
    owner_pid: int
    host: str
    token: str
    cmdline: str
    started: float          # epoch seconds
    owner_alive: bool

    @property
    def stale(self) -> bool:
        """Left by a run that is gone (on this host)."""
        return self.host == socket.gethostname() and not self.owner_alive

    def describe(self) -> str:
        age = time.time() - self.started
        return (f"pid {self.pid} (group {self.pgid}, started {age / 60:.0f} min ago by tuner pid {self.owner_pid}"
                f"{'' if self.owner_alive else ', which is gone'}): {self.cmdline[:160]}")


def _owner_alive(pid: int, server_started: float) -> bool:
    """The owner pid runs and is older than the server (a newer process with the same pid
    is a reuse, not the owner)."""
    try:
        owner = psutil.Process(pid)
        return owner.is_running() and owner.status() != psutil.STATUS_ZOMBIE and \
            owner.create_time() <= server_started + 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def marked_processes() -> list[ServerProcess]:
    """Every process this user can see that carries the marker."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
        try:
            value = proc.environ().get(MARKER_ENV)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if not value:
            continue
        host, _, rest = value.partition(":")
        owner, _, token = rest.partition(":")
        try:
            owner_pid, pgid = int(owner), os.getpgid(proc.pid)
        except (ValueError, ProcessLookupError, PermissionError):
            continue
        started = float(proc.info.get("create_time") or 0.0)
        out.append(ServerProcess(pid=proc.pid, pgid=pgid, owner_pid=owner_pid, host=host, token=token,
                                 cmdline=" ".join(proc.info.get("cmdline") or []), started=started,
                                 owner_alive=_owner_alive(owner_pid, started)))
    return out


def _mark_of(proc: psutil.Process) -> tuple[str, int, str] | None:
    """``(host, owner pid, token)`` of ``proc``'s marker, or None (no marker, gone, not ours to read)."""
    try:
        value = proc.environ().get(MARKER_ENV)
    except (psutil.Error, OSError):
        return None
    if not value:
        return None
    host, _, rest = value.partition(":")
    owner, _, token = rest.partition(":")
    return (host, int(owner), token) if owner.isdigit() else None


def processes_of(token: str | None = None, owner: int | None = None) -> list[psutil.Process]:
    """Live processes of this host carrying the marker of tuner process ``owner`` (this one
    by default), of one server when ``token`` is given: launchers, servers and whatever
    they started, in any process group or session."""
    owner = os.getpid() if owner is None else owner
    here = socket.gethostname()
    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        mark = _mark_of(proc)
        if mark is not None and mark[0] == here and mark[1] == owner and (token is None or mark[2] == token):
            out.append(proc)
    return out


def is_ours(pid: int) -> bool:
    """Process ``pid`` carries this process's marker (a server of this run, or one of its children)."""
    try:
        mark = _mark_of(psutil.Process(pid))
    except psutil.Error:
        return False
    return mark is not None and mark[0] == socket.gethostname() and mark[1] == os.getpid()


def stop_marked(token: str | None = None, owner: int | None = None, grace_s: float = 10.0) -> int:
    """Stop every process :func:`processes_of` finds (SIGTERM, SIGKILL after ``grace_s``),
    looking again until none is left (a launcher may start its server as it dies);
    returns how many were signalled."""
    signalled: set[int] = set()
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait
        while True:
            procs = processes_of(token, owner)
            if not procs:
                return len(signalled)
            for proc in procs:
                if sig == signal.SIGKILL or proc.pid not in signalled:
                    try:
                        proc.send_signal(sig)
                    except psutil.Error:
                        continue
                    signalled.add(proc.pid)
            if time.monotonic() > deadline:
                break
            psutil.wait_procs(procs, timeout=min(0.5, max(0.05, deadline - time.monotonic())))
    return len(signalled)


def stale_servers() -> list[ServerProcess]:
    """Marked processes whose owner is gone, one per process group (its leader first)."""
    groups: dict[int, ServerProcess] = {}
    for p in sorted(marked_processes(), key=lambda p: (p.pgid != p.pid, p.started)):
        if p.stale and p.pgid not in groups:
            groups[p.pgid] = p
    return list(groups.values())


def stop_group(pgid: int, grace_s: float = 10.0) -> bool:
    """SIGTERM the marked process group, SIGKILL after ``grace_s``; True when it is gone.
    Refuses a group with no marked member (never signals a process tuner did not start)."""
    members = [p for p in marked_processes() if p.pgid == pgid]
    if not members:
        return not group_alive(pgid)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return True
            time.sleep(0.05)
    return not group_alive(pgid)


def group_alive(pgid: int) -> bool:
    """True while a non-zombie process is in group ``pgid``."""
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return False


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` of this host, or None when that cannot be
    seen (another user's process, or nothing)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    return next((c.pid for c in conns
                 if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid), None)


def listener(port: int) -> str | None:
    """Who listens on TCP ``port`` of this host: ``pid 123: cmdline``, or None when that
    cannot be seen."""
    pid = listener_pid(port)
    if pid is None:
        return None
    try:
        return f"pid {pid}: {' '.join(psutil.Process(pid).cmdline())[:160]}"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return f"pid {pid}"


def die_with_parent() -> None:
    """``preexec_fn`` of a server: the kernel sends it SIGTERM when the tuner process that
    started it dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``; a no-op elsewhere)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def _load_prctl():  # looked up once in the parent: the child only calls it
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


__all__ = ["MARKER_ENV", "NAME_PREFIX", "ServerProcess", "die_with_parent", "group_alive", "is_ours", "listener",
           "listener_pid", "marked_processes", "marker", "processes_of", "stale_servers", "stop_group", "stop_marked"]

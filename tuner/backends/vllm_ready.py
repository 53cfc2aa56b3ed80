"""A started ``vllm serve`` replica's way to serving: :func:`wait_healthy` (``/health``
answers and ``/v1/models`` proves the server is the one tuner started), :func:`served_model`
(the model name requests use), :func:`warm_up` (one tiny completion) and
:func:`metrics_facts` (the startup facts ``/metrics`` tells). Each waits within the start's
timeout and the run's deadline (:func:`tuner.runtime.interrupts.current_deadline`)."""
from __future__ import annotations

import json
import os
import time
import urllib.error
from typing import Any

from tuner.backends.local_server import _http
from tuner.backends.vllm_args import classify_failure
from tuner.backends.vllm_replica import _Replica
from tuner.core.errors import BackendError, ConfigRejected, EnvironmentFault
from tuner.replay.metrics import parse_prometheus, snapshot
from tuner.runtime import processes
from tuner.runtime.interrupts import current_deadline


def wait_healthy(r: _Replica, t_start: float, startup_timeout_s: float, stop_grace_s: float) -> None:
    """Until ``/health`` answers and ``/v1/models`` names this replica's marker. A port
    that answers without the marker is another process's (found, reported, never
    killed): :class:`EnvironmentFault` ``foreign_server``, retried on another port. The
    wait is bounded by ``startup_timeout_s`` (from ``t_start``) and by the run's deadline."""
    deadline = current_deadline()
    limit = min(startup_timeout_s, time.monotonic() - t_start + deadline.remaining())
    pause = 0.01  # doubling to 0.2 s: a server up in a second is seen at once, vLLM's minute costs nothing
    while True:
        if r.exited():
            raise classify_failure(r.exit_code(), r.log_text(), log_path=str(r.log_path))
        try:
            status, _ = _http(f"{r.url}/health", timeout=2.0)
        except (OSError, urllib.error.URLError):
            status = 0
        if status == 200:
            if is_ours(r):
                r.found_server()
                return
            who = processes.listener(r.port) or "a process tuner cannot see"
            r.stop(stop_grace_s)
            raise EnvironmentFault(
                "foreign_server", f"{r.url} answers, but it is not the server tuner started ({who}); "
                "it was left running and this trial moves to another port", retry=True)
        if time.monotonic() - t_start > limit:
            r.stop(stop_grace_s)
            deadline.check()  # the run's --timeout, not this configuration: interrupted
            raise _start_timeout(r, startup_timeout_s)
        time.sleep(pause)
        pause = min(2 * pause, 0.2)


def _start_timeout(r: _Replica, startup_timeout_s: float) -> Exception:
    """The failure of a replica that did not answer in time, classified from its log."""
    err = classify_failure(None, r.log_text(), log_path=str(r.log_path))
    if isinstance(err, ConfigRejected) and err.kind == "timeout":
        err = ConfigRejected("timeout", f"no healthy server after {startup_timeout_s:g} s "
                             "(--startup-timeout); " + err.message, log_path=str(r.log_path))
    return err


def is_ours(r: _Replica) -> bool:
    """``/v1/models`` lists the replica's marker name (or, when the user named the
    model, the port's listener belongs to the replica's process group)."""
    try:
        status, body = _http(f"{r.url}/v1/models", timeout=10.0)
        names = {str(card.get("id")) for card in json.loads(body).get("data", [])} if status == 200 else set()
    except (OSError, ValueError, AttributeError):
        names = set()
    if processes.NAME_PREFIX + r.token in names:
        return True
    if any("--served-model-name" in a for a in r.argv):
        return False
    pid = processes.listener_pid(r.port)  # the port's listener is in the replica's process group
    try:
        return pid is not None and os.getpgid(pid) == r.pgid
    except (ProcessLookupError, PermissionError):
        return False


def served_model(r: _Replica) -> str:
    """The model name the replica serves (the first of ``/v1/models`` that is not tuner's marker)."""
    try:
        status, body = _http(f"{r.url}/v1/models", timeout=30.0)
        ids = [str(card["id"]) for card in json.loads(body)["data"]]
        return next((i for i in ids if not i.startswith(processes.NAME_PREFIX)), ids[0])
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise BackendError(f"{r.url}/v1/models did not name a model ({err}) [log: {r.log_path}]") from err


def warm_up(r: _Replica, model: str, t_start: float, startup_timeout_s: float) -> None:
    """One tiny completion, so the first measured request does not pay for lazy init; asked
    again while the API answers before its engine serves (503, a refused connection), within
    what is left of ``startup_timeout_s`` and the run's deadline."""
    deadline = current_deadline()
    limit, pause = min(startup_timeout_s, time.monotonic() - t_start + deadline.remaining()), 0.05
    while True:
        try:
            status, body = _http(f"{r.url}/v1/completions", data={
                "model": model, "prompt": [1000, 1001, 1002, 1003], "max_tokens": 2, "ignore_eos": True},
                timeout=300.0)
        except OSError as err:
            status, body = -1, str(err).encode()
        if status == 200:
            return
        if r.exited():
            raise classify_failure(r.exit_code(), r.log_text(), log_path=str(r.log_path))
        if status not in (-1, 503) or time.monotonic() - t_start > limit:
            deadline.check()
            raise BackendError(f"warm-up request to {r.url} failed ({status}): {body[:300]!r} "
                               f"[log: {r.log_path}]")
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def metrics_facts(r: _Replica) -> dict[str, Any]:
    """What ``/metrics`` tells of the start (the KV blocks allocated); empty when it does not answer."""

    try:
        status, body = _http(f"{r.url}/metrics", timeout=10.0)
    except OSError:
        return {}
    if status != 200:
        return {}
    snap = snapshot(parse_prometheus(body.decode("utf-8", "replace")))
    return {"num_gpu_blocks": int(snap["num_gpu_blocks"])} if "num_gpu_blocks" in snap else {}

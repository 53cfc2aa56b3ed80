"""A server a dead run left is stopped before a search starts; one that will not stop makes
the search refuse to start (exit 2, one line naming it)."""
from __future__ import annotations

import socket

import pytest

from tuner.core.errors import EnvironmentFault
from tuner.runtime import processes
from tuner.runtime.progress import observer_or_headless
from tuner.search.records import report_stale_servers

LEFT = processes.ServerProcess(pid=4242, pgid=4242, owner_pid=99, host=socket.gethostname(), token="t",
                               cmdline="vllm serve m --port 8000", started=0.0, owner_alive=False)


class Warnings:
    def __init__(self):
        self.seen: list[str] = []

    def on_warning(self, text):
        self.seen.append(text)


def test_a_stale_server_is_stopped_and_said_so(monkeypatch):
    stopped = []
    monkeypatch.setattr(processes, "stale_servers", lambda: [LEFT])
    monkeypatch.setattr(processes, "stop_group", lambda pgid, grace_s=10.0: stopped.append(pgid) or True)
    obs = Warnings()
    report_stale_servers(obs)
    assert stopped == [4242] and "stopped a server left by a dead run: pid 4242" in obs.seen[0]


def test_a_stale_server_that_will_not_stop_refuses_the_run(monkeypatch):
    monkeypatch.setattr(processes, "stale_servers", lambda: [LEFT])
    monkeypatch.setattr(processes, "stop_group", lambda pgid, grace_s=10.0: False)
    with pytest.raises(EnvironmentFault) as err:
        report_stale_servers(observer_or_headless(None))
    assert err.value.exit_code == 2 and err.value.kind == "stale_server"
    assert "kill -KILL -- -4242" in str(err.value) and "\n" not in str(err.value)


def test_a_live_runs_server_is_not_stale():
    live = processes.ServerProcess(pid=1, pgid=1, owner_pid=2, host=socket.gethostname(), token="t", cmdline="x",
                                   started=0.0, owner_alive=True)
    other_host = processes.ServerProcess(pid=1, pgid=1, owner_pid=2, host="elsewhere", token="t", cmdline="x",
                                         started=0.0, owner_alive=False)
    assert not live.stale and not other_host.stale

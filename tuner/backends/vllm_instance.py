"""A trial's running ``vllm serve`` replicas: :class:`VllmInstance` (replay a load against
them, notice one that died or stopped answering, stop them all).

A replica that exits mid-replay without tuner's signal, or that no longer answers
``/health`` after a replay whose requests lost their connections, disrupted the
measurement (:class:`~tuner.core.errors.Disrupted`): nothing it measured is kept, and the
search decides whose fault it was by experiment (:mod:`tuner.search.blame`). A signal from
outside (the OOM killer, an operator's SIGKILL) is the machine's (``killed``)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuner.backends.local_server import _http
from tuner.backends.vllm_args import classify_failure, last_words
from tuner.backends.vllm_replica import _Replica
from tuner.core.errors import BackendError, Disrupted, EnvironmentFault
from tuner.replay.client import bad_stream_fault, replay
from tuner.runtime.control import StopHook

if TYPE_CHECKING:
    from tuner.backends.vllm import VllmBackend
    from tuner.serving.load import Load
    from tuner.serving.result import RunResult
    from tuner.traffic.workload import Workload


#: Seconds a replica has to answer ``/health`` after a replay that lost connections.
SILENT_S = 5.0
#: Seconds a replica that no longer answers is given to be seen ended: a process that is
#: exiting closes its socket before it ends, and a busy host lets that moment last.
ENDING_S = 3.0


class VllmInstance:
    """Running replicas of one trial; ``run`` replays a load, ``close`` stops them."""

    def __init__(self, backend: VllmBackend, replicas: list[_Replica], info: dict[str, Any]) -> None:
        self.backend = backend
        self.replicas = replicas
        self.info = info
        self.closed = False
        self.runs = 0  # salts each run's prompts: a rerun must not hit the last run's prefix cache

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    @property
    def pgids(self) -> list[int]:
        return [r.pgid for r in self.replicas]

    def dead_replicas(self) -> list[_Replica]:
        return [r for r in self.replicas if r.exited()]

    def run(self, workload: Workload, load: Load, *, stop: StopHook | None = None) -> RunResult:
        """Replay ``load`` against the replicas. Raises :class:`Disrupted` when a replica
        exited before or during the run, or stopped answering (the log path and vLLM's last
        line are in the message), :class:`EnvironmentFault` ``killed`` for a signal from outside."""

        if self.closed:
            raise BackendError("this vLLM instance is closed; start a new one")
        self._raise_if_dead("before the run")
        self.runs += 1
        result = replay(self.urls, workload, load, model=self.info.get("model_name"), stop=stop, salt=self.runs,
                        **self.backend._replay)
        self._raise_if_dead("during the run")
        if set(result.error_counts()) & {"disconnect", "timeout"}:
            self._raise_if_silent()
        bad = bad_stream_fault(result)
        if bad is not None:  # the server's streams, not the configuration's speed
            raise EnvironmentFault(bad[0], f"the server at {', '.join(self.urls)}: {bad[1]}")
        result.server.update({k: self.info[k] for k in ("kv_cache_tokens", "num_gpu_blocks") if k in self.info})
        return result

    def _raise_if_dead(self, when: str) -> None:
        dead = self.dead_replicas()
        if dead:
            r = dead[0]
            code = r.exit_code()
            if code is None:  # a daemonized server: how it ended is not known
                raise Disrupted(f"vLLM replica at {r.url} exited {when} (its launcher runs on, so how is not "
                                f"known), which tuner did not ask: {last_words(r.log_text())} [log: {r.log_path}]",
                                path=str(r.log_path))
            cause = classify_failure(code, r.log_text(), log_path=str(r.log_path))
            if isinstance(cause, EnvironmentFault):  # killed from outside: the machine's, not the config's
                raise EnvironmentFault(cause.kind, f"vLLM replica at {r.url} died {when}: {cause.message}",
                                       path=cause.path)
            raise Disrupted(f"vLLM replica at {r.url} exited {when} (code {code}), which tuner did not ask: "
                            f"{cause.message} [log: {r.log_path}]", path=str(r.log_path))

    def _raise_if_silent(self) -> None:
        """After a replay whose requests lost their connections: a replica that no longer
        answers ``/health`` (or has exited meanwhile) disrupted it."""

        for r in self.replicas:
            try:
                status = _http(f"{r.url}/health", timeout=SILENT_S)[0]
            except OSError:
                status = 0
            if status != 200:  # a server that is exiting refuses connections before it has ended
                _wait_until(r.exited, ENDING_S)
            self._raise_if_dead("during the run")
            if status != 200:
                raise Disrupted(f"vLLM replica at {r.url} stopped answering during the run (/health: "
                                f"{status or 'no answer'} within {SILENT_S:g} s) [log: {r.log_path}]",
                                path=str(r.log_path))

    def close(self) -> None:
        """Stop every replica (SIGTERM, then SIGKILL after the grace period). Idempotent."""
        if self.closed:
            return
        self.closed = True
        for r in self.replicas:
            r.stop(self.backend.stop_grace_s)

    def __enter__(self) -> VllmInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # last resort; close() is the contract
        if not getattr(self, "closed", True):
            try:
                self.close()
            except Exception:
                pass


def _wait_until(done: Callable[[], bool], limit_s: float) -> bool:
    """Whether ``done()`` became true within ``limit_s`` (looked at every 50 ms)."""
    end = time.monotonic() + limit_s
    while not done():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True

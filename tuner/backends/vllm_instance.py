"""A trial's running ``vllm serve`` replicas: :class:`VllmInstance` (replay a load against
them, notice one that died, stop them all)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.backends.vllm_args import classify_failure
from tuner.backends.vllm_replica import _Replica
from tuner.core.errors import BackendError, EnvironmentFault
from tuner.runtime.control import StopHook

if TYPE_CHECKING:
    from tuner.backends.vllm import VllmBackend
    from tuner.serving.load import Load
    from tuner.serving.result import RunResult
    from tuner.traffic.workload import Workload


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
        return [r for r in self.replicas if r.proc.poll() is not None]

    def run(self, workload: Workload, load: Load, *, stop: StopHook | None = None) -> RunResult:
        """Replay ``load`` against the replicas. Raises BackendError if a replica died
        before or during the run (the log path and vLLM's last line are in the message)."""
        from tuner.replay.client import bad_stream_fault, replay

        if self.closed:
            raise BackendError("this vLLM instance is closed; start a new one")
        self._raise_if_dead("before the run")
        self.runs += 1
        result = replay(self.urls, workload, load, model=self.info.get("model_name"), stop=stop, salt=self.runs,
                        **self.backend._replay)
        self._raise_if_dead("during the run")
        bad = bad_stream_fault(result)
        if bad is not None:  # the server's streams, not the configuration's speed
            raise EnvironmentFault(bad[0], f"the server at {', '.join(self.urls)}: {bad[1]}")
        result.server.update({k: self.info[k] for k in ("kv_cache_tokens", "num_gpu_blocks") if k in self.info})
        return result

    def _raise_if_dead(self, when: str) -> None:
        dead = self.dead_replicas()
        if dead:
            r = dead[0]
            cause = classify_failure(r.proc.returncode, r.log_text(), log_path=str(r.log_path))
            if isinstance(cause, EnvironmentFault):  # killed from outside: the machine's, not the config's
                raise EnvironmentFault(cause.kind, f"vLLM replica at {r.url} died {when}: {cause.message}",
                                       path=cause.path)
            raise BackendError(
                f"vLLM replica at {r.url} exited {when} (code {r.proc.returncode}): {cause.message} "
                f"[log: {r.log_path}]"
            )

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

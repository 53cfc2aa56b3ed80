"""What the study driver records and checks around its trials: a failed trial's record,
the configuration already measured, the study's stamp, the GPU and stale-server checks
before a run."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.core.errors import EnvironmentFault, InputError
from tuner.core.urls import redact
from tuner.runtime import processes
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.hardware import get_gpu
from tuner.study.record import RunFacts, StudyRecord, TrialRecord, write
from tuner.study.recovery import failure

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.runtime.progress import Observer
    from tuner.search.backend import Backend
    from tuner.space import SearchSpace


def mark_trial_failed(trial: optuna.Trial, config: ServeConfig, run_facts: RunFacts, kind: str, reason: str,
                      *, gpu_s: float = 0.0, blame: dict[str, Any] | None = None) -> None:
    """What a trial that is about to FAIL stores: its config, why (``fail_kind``:
    interrupted, environment or crash; :mod:`tuner.study.recovery`), the run facts, the
    seconds its servers held the GPUs (``gpu_s``: thrown away, nothing was measured) and how
    its failure was judged (``blame``, :mod:`tuner.search.blame`)."""

    reason = redact(reason)  # a message may name an endpoint with its credentials
    write(trial.set_user_attr, TrialRecord(config=config, run=run_facts, gpu_s=gpu_s, blame=blame,
                                           error=reason[:2000] if kind == "crash" else None))
    write(trial.set_user_attr, failure(kind, reason))


def check_gpu(space: SearchSpace, backend: Backend, obs: Observer) -> None:
    """A GPU tuner's catalog does not know: the simulator cannot run it (bad input, with
    the space file's line); a real vLLM can, without pre-check or prediction (a warning)."""

    try:
        get_gpu(space.deployment.gpu)
    except InputError as err:
        if backend.simulated:
            raise space.error(err.message, ("deployment", "gpu"), hint=err.hint) from err
        obs.on_warning(f"{err.message}: no pre-check and no prediction for this GPU (add it to "
                       "~/.config/tuner/gpus.yaml to get both)")


def report_stale_servers(obs: Observer, kill: bool = True) -> None:
    """Stop the servers a dead tuner run left on this host, before anything starts: they are
    provably tuner's (the marker names this host and an owner that is gone, or a pid reused
    by a process younger than the server) and hold GPUs the study needs. One that will not
    stop is :class:`~tuner.core.errors.EnvironmentFault` ``stale_server`` (exit 2): the run
    refuses to start beside it. ``kill`` is kept for callers of the old ``--kill-stale``;
    servers of runs still alive are never touched."""

    for server in processes.stale_servers():
        if not processes.stop_group(server.pgid):
            raise EnvironmentFault("stale_server", f"a server left by a dead run did not stop: {server.describe()}; "
                                   f"stop it (kill -KILL -- -{server.pgid}, or tuner doctor --kill-stale) and rerun")
        obs.on_warning(f"stopped a server left by a dead run: {server.describe()}")


def same_config(study: optuna.Study, config: ServeConfig, fingerprint: str | None = None,
                 tags: dict[str, Any] | None = None) -> FrozenTrial | None:
    """An earlier COMPLETE trial of ``study`` that ran exactly ``config`` (on the same
    workload and with the same ``tags``, when given)."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        rec = TrialRecord.from_trial(t)
        if rec.config != config or rec.is_repeat or rec.is_confirmation:
            continue
        studied = rec.run.workload_fingerprint
        if fingerprint and (studied or fingerprint) != fingerprint:
            continue
        if any(rec.tags.get(k) != v for k, v in (tags or {}).items()):
            continue
        return t
    return None


def stamp_study(st: optuna.Study, space: SearchSpace, deployment: Deployment, fingerprint: str,
                 backend: str, sampler: str, seed: int, target: float, objective: str = "tokens") -> None:
    """What the study was made for, written once, when it is created."""
    if StudyRecord.from_study(st).space:
        return
    stamp = StudyRecord(space=space.name, space_path=space.path, deployment=deployment,
                        workload_fingerprint=fingerprint, backend=backend, sampler=sampler, seed=seed,
                        target_ttft_s=target, load_kind=space.workload.load, slos=space.workload.slos,
                        objective=objective, space_fingerprint=space.fingerprint(), space_content=space.content())
    write(st.set_user_attr, stamp)

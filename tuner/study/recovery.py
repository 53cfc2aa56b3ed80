"""Trials that did not measure their configuration, and putting that right.

A trial can end without saying anything about its configuration: the run was
*interrupted* (a signal, ``--timeout``, a process killed so hard that its trial stayed
RUNNING), or the *environment* failed (a taken port, a full disk, a command that rejects
tuner's flags). Such a trial is FAIL with ``fail_kind`` ``interrupted`` or ``environment``
in its user attrs; it does not use the budget, the sampler never sees it (Optuna's
samplers learn from COMPLETE and PRUNED trials only), and when the study resumes its
configuration is queued again (:func:`requeue`), so a grid study still measures every
point. A configuration that failed :data:`MAX_FAILURES` times is not queued again: the
search reports it instead of retrying it for ever.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.study.record import NOT_MEASURED, TrialRecord, write
from tuner.study.storage import trial_id

if TYPE_CHECKING:
    import optuna

#: Failures of one configuration after which it is reported, not queued again.
MAX_FAILURES = 2


def not_measured(trial: Any) -> bool:
    """A FAIL trial that says nothing about its configuration."""
    from optuna.trial import TrialState

    return trial.state == TrialState.FAIL and TrialRecord.from_trial(trial).measured_nothing


def failure(kind: str, reason: str) -> TrialRecord:
    """What a failed trial records about why (``fail_kind``, ``fail_reason``)."""
    return TrialRecord(fail_kind=kind, fail_reason=reason[:2000])


def mark_failed(storage: Any, trial_id: int, kind: str, reason: str) -> None:
    """Record why a trial failed, through the storage (a trial that no live
    ``optuna.Trial`` holds: a leftover of another process), before Optuna sets its state."""
    write(lambda key, value: storage.set_trial_user_attr(trial_id, key, value), failure(kind, reason))


def fail_leftovers(study: optuna.Study, storage: Any) -> list[int]:
    """Fail every RUNNING trial as ``interrupted`` (call it holding the study's only
    writer lock, i.e. on SQLite: no other process can be running them); ``storage`` is
    the study's (:func:`tuner.study.storage.storage_of`). Returns their numbers."""
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        rec = TrialRecord.from_trial(t)
        who = rec.worker or "a process that never claimed it"
        here = rec.host in (None, socket.gethostname())
        reason = f"left RUNNING by {who}, which is gone" + ("" if here else " (another host)")
        mark_failed(storage, trial_id(storage, study, t.number), "interrupted", reason)
        study.tell(t.number, state=TrialState.FAIL)
        out.append(t.number)
    return out


@dataclass
class Requeued:
    """What :func:`requeue` did: trials queued again, and configurations given up on."""

    queued: list[int] = field(default_factory=list)          # numbers of the failed trials
    given_up: list[dict[str, Any]] = field(default_factory=list)  # {"params", "failures", "reasons"}


def requeue(study: optuna.Study, max_failures: int = MAX_FAILURES) -> Requeued:
    """Queue again (as WAITING trials with ``retry_of``) the configurations of failed
    trials that measured nothing and were not retried yet, unless the configuration
    failed ``max_failures`` times already."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    records = {t.number: TrialRecord.from_trial(t) for t in trials}
    retried = {r.retry_of for r in records.values()} | {t.system_attrs.get("failed_trial") for t in trials}
    waiting = {_key(t.params) for t in trials if t.state == TrialState.WAITING}
    failures: dict[tuple, list[Any]] = {}
    for t in trials:
        if t.state == TrialState.FAIL:
            failures.setdefault(_key(t.params), []).append(t)
    out = Requeued()
    for t in trials:
        if not not_measured(t) or t.number in retried or not t.params:
            continue
        key = _key(t.params)
        if key in waiting:
            continue
        fails = failures.get(key, [])
        if len(fails) >= max_failures:
            if not any(g["params"] == t.params for g in out.given_up):
                out.given_up.append({"params": dict(t.params), "failures": len(fails),
                                     "reasons": [records[f.number].fail_reason or records[f.number].error or ""
                                                 for f in fails]})
            continue
        study.enqueue_trial(dict(t.params), user_attrs=TrialRecord(retry_of=t.number).to_attrs(), skip_if_exists=False)
        waiting.add(key)
        out.queued.append(t.number)
    return out


def _key(params: dict[str, Any]) -> tuple:
    return tuple(sorted(params.items()))


__all__ = ["MAX_FAILURES", "NOT_MEASURED", "Requeued", "fail_leftovers", "failure", "mark_failed", "not_measured", "requeue"]  # noqa: E501

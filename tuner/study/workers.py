"""Several ``tuner search`` processes on one study: one per GPU host, or per GPU set.

Coordination is Optuna's RDB storage; nothing here is a coordinator of its own.

* **Shared storage** (any SQLAlchemy URL but SQLite, e.g. ``postgresql://...``): the
  storage runs Optuna's heartbeat (every :func:`heartbeat_s` seconds, env
  ``TUNER_HEARTBEAT_S``, default 60). A trial whose worker stops beating for
  ``GRACE_FACTOR`` heartbeats is marked FAIL by whichever worker looks next, and
  :class:`RetryOnce` (Optuna's ``RetryHeartbeatStaleTrialCallback(max_retry=1)``) puts
  its configuration back as a WAITING trial, which the next ``ask`` takes: retried once.
  A worker that was only stalled finds its trial failed, warns and goes on. A RUNNING
  trial no worker ever claimed (left by a process without heartbeat) is ignored after
  the grace period.
* **Global budget.** ``--budget N`` counts the study's finished trials plus those running
  anywhere (a FAIL that has been retried counts once, through its retry). Each worker
  checks that count and creates its next trial while holding a PostgreSQL advisory lock
  (``pg_advisory_lock``, keyed by the study name), so two workers can never both take
  the last slot: all workers together stop at exactly N finished trials. A worker that
  finds the budget spent while others still run waits for them (it is the one that
  fails a dead worker's trial and runs its retry), then exits. Other server databases
  (MySQL, ...) get no lock: the count is checked without it and may overshoot by the
  number of workers racing for the last slot.
* **Duplicates.** Workers draw different sampler seeds (``seed`` + a per-process
  offset). When a worker is proposed a configuration that another running trial is
  measuring, it waits for that trial and copies its result (``repeat_of``) instead of
  running it twice (the check and the claim hold the budget lock).
* **Attribution.** Every trial records ``worker`` (``host:pid``), ``host``, ``pid`` and
  ``gpus`` (``CUDA_VISIBLE_DEVICES`` or the deployment's GPU ids/count) in its user attrs;
  a retry also records ``retry_of`` (the failed trial's number).
* **SQLite** holds one writer: a search takes an exclusive lock file beside the
  database for its whole run, and a second process on the same study fails at once
  with :class:`StudyBusy`, pointing to PostgreSQL. (Several SQLite writers can meet
  ``database is locked`` mid-trial and have no advisory lock for the budget; refusing
  up front is safer.)
"""
from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tuner.study import free_copies, is_copy
from tuner.study.locks import StudyBusy, StudyLock, process_label, sqlite_path
from tuner.study.record import TrialRecord, write
from tuner.study.recovery import not_measured
from tuner.study.storage import (
    GRACE_FACTOR,
    RUN_STATE_PREFIX,
    default_storage,
    heartbeat_s,
    is_shared,
    storage_fault,
    storage_of,
    trial_id,
)

if TYPE_CHECKING:
    import optuna

#: A trial's system attr: it passed :meth:`Worker.wait_for_twin` and measures its parameters.
MEASURING = f"{RUN_STATE_PREFIX}measuring"

#: A SQLite study's disk must have this much free before a trial starts.
MIN_STUDY_FREE_BYTES = 1 << 20


def identity(gpus: Any = None) -> dict[str, Any]:
    """This worker as trial attrs: host, pid, GPUs (CUDA_VISIBLE_DEVICES wins)."""
    host = socket.gethostname()
    pid = os.getpid()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = visible
    elif isinstance(gpus, (tuple, list)):
        gpus = ",".join(str(g) for g in gpus)
    return {"worker": process_label(), "host": host, "pid": pid, "gpus": None if gpus is None else str(gpus)}


def worker_seed(seed: int, storage: str | None) -> int:
    """The sampler seed: ``seed`` alone, or with a per-process offset on a shared
    storage (workers with one seed would propose the same configurations in lockstep)."""
    if not is_shared(storage):
        return seed
    ident = identity()["worker"]
    return (seed + int(hashlib.sha256(ident.encode()).hexdigest()[:7], 16)) % (2**31)


# -- the budget --------------------------------------------------------------------------
def _orphan(trial: Any, now: dt.datetime) -> bool:
    """A RUNNING trial no tuner worker claimed (no ``worker`` attr, which a worker sets
    right after creating it) for longer than a grace period: left by a process without a
    heartbeat, so nobody will ever fail it. It is neither counted nor waited for."""
    if TrialRecord.from_trial(trial).worker is not None or trial.datetime_start is None:
        return False
    return (now - trial.datetime_start).total_seconds() > GRACE_FACTOR * heartbeat_s()


def budget_used(study: optuna.Study, *, shared: bool, exclude: int | None = None) -> tuple[int, int]:
    """``(used, running)``: trials that count against the budget — COMPLETE, PRUNED,
    FAIL unless retried or it measured nothing (interrupted, environment:
    :mod:`tuner.study.recovery`), and (shared storage) RUNNING — and how many of them run.
    Copies of a configuration measured before are free up to :data:`tuner.study.FREE_COPIES`.
    On SQLite a RUNNING trial is a leftover of a killed process and does not count."""
    from optuna.trial import TrialState

    now = dt.datetime.now()  # Optuna stamps trials with naive local time
    trials = study.get_trials(deepcopy=False)
    retried = {t.system_attrs.get("failed_trial") for t in trials} - {None}
    used = running = copies = 0
    for t in trials:
        if t.number == exclude or TrialRecord.from_trial(t).is_confirmation:  # repeats: outside the budget
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            used += 1
            copies += is_copy(t)
        elif t.state == TrialState.FAIL:
            used += t.number not in retried and not not_measured(t)
        elif t.state == TrialState.RUNNING and shared and not _orphan(t, now):
            used += 1
            running += 1
    return used - free_copies(copies), running


class Worker:
    """One process's share of a study: the guarded trial loop (see the module docstring).

    ``with Worker(study, url, budget=40) as w: w.optimize(objective, ...)``; the
    objective calls :meth:`started` first and :meth:`wait_for_twin` after sampling."""

    def __init__(self, study: optuna.Study, storage: str | None, *, budget: int,
                 timeout_s: float | None = None, gpus: Any = None, tags: dict[str, Any] | None = None) -> None:

        self.study = study
        self.url = storage or default_storage(study.study_name)
        self.storage = storage_of(study, self.url)  # the study's storage handle (trial writes by id)
        self._trial_ids: dict[int, int] = {}  # trial number -> the storage's trial id
        self.shared = is_shared(self.url)
        self.budget = budget
        self.timeout_s = timeout_s
        self.stamp = TrialRecord(tags=dict(tags or {}), **identity(gpus))  # on every trial it starts
        self.poll_s = min(1.0, heartbeat_s() / 2) if self.shared else 0.2
        self._budget_lock: StudyLock | None = None
        self._writer_lock: StudyLock | None = None
        self.ran = 0  # trials this process started
        self._current: int | None = None
        self.halt: str | None = None  # set to end the loop for a reason of ours
        self.window_closed = False  # the next trial would not have fitted in the time left
        self.leftovers: list[int] = []  # RUNNING trials of a dead process, failed on entry (SQLite)

    def __enter__(self) -> Worker:
        if self.shared:
            self._budget_lock = StudyLock(self.url, self.study.study_name, "budget")
        else:
            self._writer_lock = StudyLock(self.url, self.study.study_name, "writer")
            if not self._writer_lock.acquire(blocking=False):
                holder = self._writer_lock.holder()
                self._writer_lock.close()
                raise StudyBusy(
                    f"study {self.study.study_name!r} ({self.url}) is being searched by {holder}; "
                    "SQLite takes one writer",
                    hint="to share a study between workers, use a server database: "
                         "--storage postgresql://user:password@host/db",
                )
            # we are the only writer: a RUNNING trial belongs to a process that is gone
            from tuner.study.recovery import fail_leftovers

            self.leftovers = fail_leftovers(self.study, self.storage)
        return self

    def __exit__(self, *exc: object) -> None:
        for lock in (self._budget_lock, self._writer_lock):
            if lock is not None:
                lock.close()

    def optimize(self, objective: Callable[[optuna.Trial], float], *, catch: tuple[type[Exception], ...] = (),
                 callbacks: Sequence[Callable[..., None]] = (), may_start: Callable[[], bool] | None = None) -> None:
        """Run trials until the study's budget is used (counting other workers' trials),
        then wait for the trials still running elsewhere; stop starting trials after
        ``timeout_s``, or when ``may_start`` says the next one would not fit (then
        ``window_closed`` is set)."""
        import optuna

        t0 = time.monotonic()
        lock = self._budget_lock
        while self.timeout_s is None or time.monotonic() - t0 < self.timeout_s:
            if lock is not None:
                lock.acquire()
            try:
                if self.shared:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                        optuna.storages.fail_stale_trials(self.study)
                used, running = budget_used(self.study, shared=self.shared)
                if used < self.budget:
                    if may_start is not None and not may_start():
                        self.window_closed = True
                        return
                    self._check_room()
                    # the trial is created under the lock; ``started`` releases it
                    try:
                        self.study.optimize(objective, n_trials=1, catch=catch, callbacks=list(callbacks),
                                            gc_after_trial=False, show_progress_bar=False)
                    except (optuna.exceptions.UpdateFinishedTrialError, ValueError, AssertionError) as err:
                        # Optuna could not record the result: when this process stalled past
                        # the grace period, another worker failed its trial (and queued the
                        # retry); go on with the next one. A database that cannot be written
                        # is the environment's fault; anything else is a real error.
                        fault = storage_fault(err, self.url)
                        if fault is not None:
                            raise fault from err
                        if not self._taken_for_dead():
                            raise
                    except Exception as err:
                        fault = storage_fault(err, self.url)
                        if fault is not None:
                            raise fault from err
                        raise
                    if self.halt is not None or self._grid_done():
                        return
                    continue
            finally:
                if lock is not None:
                    lock.release()
            if running == 0:
                return
            time.sleep(self.poll_s)

    def budget_guard(self) -> contextlib.AbstractContextManager[None]:
        """Hold the study's budget lock (shared storage) while a trial is queued for a
        free slot: two workers checking the budget at once would otherwise both queue one,
        and the second would be left WAITING when the budget is spent."""
        return self._budget_lock.holding() if self._budget_lock is not None else contextlib.nullcontext()

    def _check_room(self) -> None:
        """Before a trial on SQLite: stop cleanly when the study's disk is nearly full
        (a trial writes tens of kB; failing mid-trial would leave it RUNNING)."""
        import shutil

        path = sqlite_path(self.url)
        if path is None:
            return
        try:
            free = shutil.disk_usage(path.parent).free
        except OSError:
            return
        if free < MIN_STUDY_FREE_BYTES:
            from tuner.core.errors import EnvironmentFault

            raise EnvironmentFault("disk_full", f"the disk of {path} has {free / 1024:.0f} kB free; free space there "
                                   "and run again (every finished trial is kept)", path=str(path))

    def _grid_done(self) -> bool:
        """The study's grid sampler has measured every point (Optuna's ``is_exhausted``) and
        no retry waits: the grid counts a failed point as seen, its retry still runs."""
        is_exhausted = getattr(self.study.sampler, "is_exhausted", None)  # GridSampler's
        return callable(is_exhausted) and bool(is_exhausted(self.study)) and not self._waiting()

    def _waiting(self) -> bool:
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _taken_for_dead(self) -> bool:
        from optuna.trial import TrialState

        if self._current is None:
            return False
        trial = self.storage.get_trial(self._id_of(self._current))
        if trial.state != TrialState.FAIL:
            return False
        warnings.warn(f"trial {trial.number} was marked failed by another worker (this one missed its "
                      f"heartbeats); its configuration is retried", RuntimeWarning, stacklevel=2)
        return True

    def _id_of(self, number: int) -> int:
        """The storage's id of the study's trial ``number``."""

        if number not in self._trial_ids:
            self._trial_ids[number] = trial_id(self.storage, self.study, number)
        return self._trial_ids[number]

    def started(self, trial: optuna.Trial) -> None:
        """First thing in the objective: the trial exists, let other workers count it;
        stamp who runs it."""
        if self._budget_lock is not None:
            self._budget_lock.release()
        self._current = trial.number
        self.ran += 1
        failed = self.storage.get_trial_system_attrs(self._id_of(trial.number)).get("failed_trial")
        write(trial.set_user_attr, self.stamp.replace(retry_of=failed))

    def wait_for_twin(self, trial: optuna.Trial) -> None:
        """Wait while another trial measures the same parameters elsewhere (its result is
        then reused instead of running the configuration twice).

        A trial's parameters appear one by one as it samples them, so a trial's number says
        nothing about which of two twins sampled first. Under the budget lock each trial
        looks for a twin that is measuring and, finding none, marks itself
        (:data:`MEASURING`): of two twins the one that looks second waits, whatever their
        numbers. (Waiting for lower-numbered twins only let a trial that sampled late run
        a configuration a higher-numbered trial was already measuring.)"""
        from optuna.trial import TrialState

        if not self.shared:
            return
        import optuna

        params = trial.params
        while True:
            with warnings.catch_warnings():  # a twin whose worker died fails here, then we run it
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)
            with self.budget_guard():
                # (a claimed trial went through ``started``, which stamps its worker: never an orphan)
                twins = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                         if t.number != trial.number and t.params == params and t.system_attrs.get(MEASURING)]
                if not twins:
                    self.storage.set_trial_system_attr(self._id_of(trial.number), MEASURING, True)
                    return
            time.sleep(self.poll_s)

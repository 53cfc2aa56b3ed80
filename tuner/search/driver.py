"""The study driver: run (or resume) an Optuna study of a search space until it holds its
budget of finished trials, then confirm its winner.

:func:`~tuner.search.run.run_search` opens the run (:func:`~tuner.search.setup.open_search`:
the study, vLLM's defaults and warm-start configurations queued first) and hands the opened
:class:`~tuner.search.setup.Setup` to a :class:`SearchRun`, whose trials are
:class:`~tuner.search.trial.TrialObjective`'s. Trials that measure nothing (interrupted,
failed by the environment) do not use the budget and are queued again
(:mod:`tuner.study.recovery`); two environment faults in a row stop the run. Several
processes may share one server-database study (:mod:`tuner.study.workers`).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tuner.core.errors import EnvironmentFault
from tuner.runtime.interrupts import Deadline, Interrupted, deadline_scope
from tuner.search.blame import Referee
from tuner.search.confirm import WindowFull, confirm_winner
from tuner.search.outcome import SearchOutcome
from tuner.search.progress import quiet_optuna
from tuner.search.trial import TrialObjective
from tuner.search.window import trial_estimate
from tuner.study import best_feasible_trial, confirmation, count_finished
from tuner.study.locks import StudyLock
from tuner.study.record import TrialRecord
from tuner.study.recovery import requeue
from tuner.study.sqlite_file import lost
from tuner.study.workers import Worker, budget_used

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.search.setup import Setup

#: Environment faults in a row after which the search stops (one may be a passing glitch).
ENVIRONMENT_FAULTS_TO_STOP = 2


class SearchRun:
    """One process's run of an opened study (``setup``, :func:`~tuner.search.setup.open_search`):
    its trials (:attr:`objective`), what happened after each (:meth:`after`), the
    confirmation of the winner, and the outcome (:meth:`run`)."""

    def __init__(self, setup: Setup) -> None:
        ctx = setup.ctx
        self.setup, self.ctx, self.study, self.obs = setup, ctx, setup.study, ctx.obs
        self.notes: list[str] = list(setup.notes)
        self.referee = Referee(ctx.backend, ctx.deployment, ctx.workload, self.obs)
        self.objective = TrialObjective(setup, self.referee, self.queue_next)
        self.copies = 0  # this run's trials that re-read a measurement (no server start, no budget slot)
        self.env_faults: list[str] = []
        self.window_left: str | None = None  # what --timeout left undone, when not trials of the budget
        self.worker: Any = None
        self.window = Deadline(None)
        self.undecided: list[int] = []  # trials whose failure waits for a configuration that works
        self.lost: Exception | None = None  # the study file vanished (tuner.study.sqlite_file)

    @property
    def settings(self) -> Any:
        return self.ctx.settings

    # -- the run --------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        """Trials until the budget is used (or ``--timeout``), the winner confirmed, the outcome."""

        self._endpoint_budget()
        s, st, dep = self.settings, self.study, self.ctx.deployment
        interrupted: Interrupted | None = None
        with Worker(st, self.setup.storage, budget=s.budget, timeout_s=s.timeout_s,
                    gpus=dep.gpu_ids or dep.gpu_count, tags=self.setup.tags) as worker:
            self.worker = self.objective.worker = worker
            self._recover()
            self.window = Deadline(s.timeout_s)
            try:
                with deadline_scope(self.window), quiet_optuna():
                    worker.optimize(self.objective, catch=(Exception,), callbacks=[self.after], may_start=self._fits)
                    if not worker.window_closed:
                        self._confirm()
            except Interrupted as err:
                if err.reason != "timeout":
                    raise
                interrupted = err  # --timeout cut a trial: it is measured again on resume
                self.notes.append("--timeout reached during a trial: it was stopped, is not counted, and is "
                                  "measured again when the study resumes")
        if worker.window_closed:
            interrupted = interrupted or Interrupted("timeout")
            self.notes.append(self._window_note())
        self._raise_for_faults(interrupted)
        return self._outcome(interrupted is not None)

    def _endpoint_budget(self) -> None:
        """A backend that cannot apply a configuration measures its server once per run."""
        if self.ctx.backend.restarts:
            return
        s = self.settings
        self.ctx = replace(self.ctx, settings=replace(s, budget=min(s.budget, count_finished(self.study) + 1),
                                                      confirm=0))
        self.notes.append(f"the {self.ctx.backend.name} backend cannot change the server's configuration: the "
                          "server is measured once per run as it is configured, and no configurations are "
                          "compared (the space's knobs were not applied)")
        self.obs.on_warning(self.notes[-1])

    def _recover(self) -> None:
        """Trials a dead run left RUNNING, and configurations given up on, said once."""

        for number in self.worker.leftovers:
            self.obs.on_warning(f"trial {number} was left RUNNING by a run that is gone: failed as interrupted "
                                "(not counted) and measured again")
        for g in requeue(self.study).given_up:
            self.notes.append(f"configuration {g['params']} failed {g['failures']} times without a measurement "
                              f"({'; '.join(str(r) for r in g['reasons'])[:300]}); not retried")
            self.obs.on_warning(self.notes[-1])

    def _window_note(self) -> str:
        s, st = self.settings, self.study
        left = max(0, s.budget - count_finished(st))
        what = self.window_left or f"{left} of the budget's {s.budget} trials are"
        return (f"--timeout: {self.window.remaining():.0f} s left, less than the {trial_estimate(st) or 0:.0f} s "
                f"the study's longest trial took, so no trial was started that could not finish; {what} left for "
                "the next run (the same command goes on)")

    def _raise_for_faults(self, interrupted: Interrupted | None) -> None:
        """The run's end raised where it was the machine's: the study file lost, the endpoint
        gone, environment faults in a row, or the space run out on one."""
        worker = self.worker
        if self.lost is not None:
            raise self.lost
        if self.referee.extra_starts:
            self.notes.append(self.blame_note())
        if self.objective.endpoint_fault is not None:
            raise self.objective.endpoint_fault
        if worker.halt is not None:
            raise EnvironmentFault("environment", f"stopped after {ENVIRONMENT_FAULTS_TO_STOP} environment faults "
                                   f"in a row (no configuration was judged by them): {worker.halt}")
        if self.env_faults and not worker.window_closed and interrupted is None:
            # the space ran out (a grid's last point) on a fault of the machine: not "no configuration met"
            raise EnvironmentFault("environment", "the run ended on an environment fault (no configuration was "
                                   f"judged by it): {self.env_faults[-1]}")

    def _outcome(self, timed_out: bool) -> SearchOutcome:
        st, ctx = self.study, self.ctx
        return SearchOutcome(st, self.setup.name, self.setup.storage, best_feasible_trial(st), count_finished(st),
                             self.worker.ran, time.perf_counter() - self.setup.t0, self.objective.gpu_s,
                             notes=self.notes, timed_out=timed_out, confirmation=confirmation(st),
                             deployment=ctx.deployment, target_ttft_s=ctx.slo.target_ttft_s,
                             backend=ctx.backend.name, slos=ctx.slo.texts, copies=self.copies)

    def blame_note(self) -> str:
        """What judging failures by experiment cost this run (tuner.search.blame)."""
        r, gpu_s = self.referee, self.objective.gpu_s
        share = (lambda x: f" ({x / gpu_s:.1%} of the study's {gpu_s:,.0f} s)" if gpu_s > 0 else "")
        return (f"whose fault a failure was took {r.extra_starts} extra start{'s' * (r.extra_starts != 1)}, "
                f"{r.gpu_s:,.0f} s of GPU time{share(r.gpu_s)}: {r.controls} control run{'s' * (r.controls != 1)} "
                f"of a configuration known to work, {r.control_gpu_s:,.0f} s{share(r.control_gpu_s)}, and failed "
                "configurations started again")

    # -- between trials -------------------------------------------------------------------
    def _fits(self) -> bool:
        """Whether the next trial fits in what is left of ``--timeout``, by the longest
        trial of this study that started a server (:func:`trial_estimate`); with none
        measured yet there is nothing to go by and it starts."""
        need = trial_estimate(self.study)
        return need is None or self.window.remaining() >= need

    def queue_next(self, study: optuna.Study, queue: Callable[[], object]) -> None:
        """Call ``queue`` (which enqueues the next trial) when :meth:`_another_trial` says
        there is room; the check and the enqueue hold the study's budget lock, so two
        workers never both fill the last slot."""
        with self.worker.budget_guard():
            if self._another_trial(study):
                queue()

    def _another_trial(self, study: optuna.Study) -> bool:
        """Whether the budget leaves a trial after this one and those running (here or in
        other workers) and none is queued yet: a trial queued for it is not left WAITING
        in the study when the run ends."""
        from optuna.trial import TrialState

        pending = study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
        if any(t.state == TrialState.WAITING for t in pending):
            return False
        return count_finished(study) + len(pending) < self.settings.budget

    def after(self, st: optuna.Study, trial: FrozenTrial) -> None:
        """Optuna's callback after each trial: environment faults counted, progress."""

        rec = TrialRecord.from_trial(trial)
        self.copies += rec.is_repeat and not rec.is_confirmation
        if (gone := lost()) is not None:  # the study file was deleted or replaced: stop before losing more
            self.lost = gone
            self.worker.halt = str(gone)
            st.stop()
            return
        if rec.fail_kind == "environment":
            self._environment_fault(st, trial, rec)
        else:
            self.env_faults.clear()
            if rec.fail_kind == "crash":
                self.obs.on_warning(f"trial {trial.number} failed: {rec.fail_reason}")
            if rec.loads and self.undecided:  # a configuration works now: the control can judge them
                for number in self.undecided:
                    self._retry(st, st.trials[number])
                self.undecided.clear()
        self.obs.on_trial(trial, best_feasible_trial(st), count_finished(st))

    def _environment_fault(self, st: optuna.Study, trial: FrozenTrial, rec: TrialRecord) -> None:
        """A trial the machine failed: the run stops (the endpoint gone, two in a row), waits
        to judge it (nothing has worked yet), or measures it again (killed from outside)."""
        if self.objective.endpoint_fault is not None:
            self.worker.halt = str(self.objective.endpoint_fault)
            st.stop()
        elif str(rec.fail_reason).startswith("undecided:"):
            self.undecided.append(trial.number)  # judged again once a configuration has worked
            self.obs.on_warning(f"trial {trial.number} failed, not counted: {rec.fail_reason}")
        else:
            self.env_faults.append(str(rec.fail_reason))
            self.obs.on_warning(f"trial {trial.number} failed by the environment, not counted: {self.env_faults[-1]}")
            if len(self.env_faults) >= ENVIRONMENT_FAULTS_TO_STOP:
                self.worker.halt = self.env_faults[-1]
                st.stop()
            elif str(rec.fail_reason).startswith("killed:") and rec.retry_of is None and trial.params:
                # killed from outside: measured again once, now (the best may be the one killed)
                self._retry(st, trial)

    def _retry(self, st: optuna.Study, trial: FrozenTrial) -> None:
        """Queue ``trial``'s configuration again now (not counted twice: the failure was not)."""
        with self.worker.budget_guard():
            st.enqueue_trial(dict(trial.params), user_attrs=TrialRecord(retry_of=trial.number).to_attrs(),
                             skip_if_exists=False)

    def _confirm(self) -> None:
        """Confirm the winner once the budget is spent and nothing runs elsewhere; of
        several workers, the one that takes the study's confirm lock does it."""

        s, st, worker = self.settings, self.study, self.worker
        used, running = budget_used(st, shared=worker.shared)
        if s.confirm <= 0 or worker.halt is not None or used < s.budget or running:
            return
        lock = StudyLock(worker.url, st.study_name, "confirm") if worker.shared else None
        try:
            if lock is not None and not lock.acquire(blocking=False):
                self.notes.append(f"{lock.holder()} is confirming the winner")
                return
            try:
                confirm_winner(st, self.ctx, run_facts=self.setup.run_facts, tags=self.setup.tags,
                               may_start=self._fits, referee=self.referee)
            except WindowFull as err:  # its repeats so far are kept: the next run goes on from them
                self.worker.window_closed = True
                self.window_left = f"the confirmation's repeats from {err} on are"
        finally:
            if lock is not None:
                lock.close()


__all__ = ["ENVIRONMENT_FAULTS_TO_STOP", "SearchRun"]

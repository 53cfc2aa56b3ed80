"""The study driver: run (or resume) an Optuna study of a search space until it holds its
budget of finished trials, then confirm its winner.

:func:`~tuner.search.run.run_search` opens the study (:mod:`tuner.search.setup`), queues vLLM's defaults and warm-start configurations
first, and runs a :class:`SearchRun`: per trial the sampler proposes a configuration, a
configuration already measured is copied (``repeat_of``), the predictor may prune it
(:mod:`tuner.search.pruning`), else :func:`~tuner.search.objective.evaluate_config`
measures it. Trials that measure nothing (interrupted, failed by the environment) do not
use the budget and are queued again (:mod:`tuner.study.recovery`); two environment faults in a
row stop the run. Several processes may share one server-database study
(:mod:`tuner.study.workers`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tuner.core.errors import EndpointFault, EnvironmentFault
from tuner.core.jsonsafe import json_safe
from tuner.runtime.interrupts import Deadline, Interrupted, deadline_scope
from tuner.runtime.progress import Observer, observer_or_headless
from tuner.search.blame import Referee, itl_tail
from tuner.search.boundary import incumbent as sure_incumbent
from tuner.search.boundary import lowest_p95, sampler_constraint
from tuner.search.confirm import WindowFull, confirm_winner, study_noise
from tuner.search.constraints import tell_constraints
from tuner.search.inputs import build_workload, check_requests_fit, get_backend_by_name, workload_facts, workload_file
from tuner.search.objective import CONSTRAINT, evaluate_config, rejected
from tuner.search.outcome import SearchOutcome
from tuner.search.progress import quiet_optuna
from tuner.search.pruning import explore, propose, prune
from tuner.search.records import check_gpu, mark_trial_failed, same_config
from tuner.search.settings import SearchSettings
from tuner.search.setup import StudySetup
from tuner.search.verdict import copy_source
from tuner.search.window import fit_to_window, replay_cost, trial_estimate
from tuner.serving.config import ServeConfig
from tuner.study import best_feasible_trial, count_finished, study_name
from tuner.study.record import QUEUED, RunFacts, TrialRecord, write

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.search.backend import Backend
    from tuner.search.prediction import Predictor
    from tuner.space import SearchSpace
    from tuner.traffic.workload import Workload

#: Environment faults in a row after which the search stops (one may be a passing glitch).
ENVIRONMENT_FAULTS_TO_STOP = 2


class SearchRun(StudySetup):
    """One process's run of a study (:func:`run_search` builds it): set up in
    ``__init__`` (nothing written yet but the study), trials in :meth:`objective`."""

    def __init__(self, space: SearchSpace, backend: Backend | str, workload: Workload | None, storage: str | None,
                 study: str | None, settings: SearchSettings, *, enqueue: Sequence[ServeConfig] = (),
                 observer: Observer | None = None, tags: dict[str, Any] | None = None,
                 predictor: Predictor | str | None = "auto") -> None:
        self.t0 = time.perf_counter()
        self.space, self.settings, self.storage = space, settings, storage
        self.obs = observer_or_headless(observer)
        self.tags = dict(tags or {})
        self.deployment = space.deployment
        self.backend = get_backend_by_name(backend) if isinstance(backend, str) else backend
        check_gpu(space, self.backend, self.obs)
        self.backend.preflight(self.deployment)  # EnvironmentFault before any study or trial is written
        if workload is None:
            self.obs.on_phase("building workload")
            workload = build_workload(space.workload, self.deployment)
        check_requests_fit(workload, space)  # a request no configuration can serve: named before anything is written
        self.workload = workload
        self.fingerprint = workload.fingerprint()
        self.target = space.workload.target_ttft_s
        self.slos = space.workload.slo_set()
        self.predictor = self._predictor(predictor)
        self.name = study or study_name(self.deployment, self.fingerprint, space.name, self.backend.name, self.target,
                                        self.slos.key() + (".goodput" if settings.objective == "goodput" else ""))
        self.study = self._open()
        self._enqueue(enqueue)
        s = settings
        # a trace one trial cannot replay within --timeout: a seeded sample of it (the study keeps its name)
        self.workload, sampled = fit_to_window(workload, s.timeout_s, s.max_replays, s.seed, lambda: replay_cost(
            self.backend, self.deployment, workload, self.study))
        self.run_facts = RunFacts(
            workload_fingerprint=self.fingerprint, workload_source=json_safe(workload.source),
            workload_file=workload_file(space, workload), workload_requests=len(self.workload),
            **workload_facts(workload), backend=self.backend.name, restarts=self.backend.restarts,
            simulated=self.backend.simulated, hardware=self.deployment, seed=s.seed,
            load_seed=s.seed, sample=sampled or "as logged", sampler=s.sampler, space=space.name,
            load_kind=space.workload.load,
        )
        self.gpu_s = 0.0
        self.copies = 0  # this run's trials that re-read a measurement (no server start, no budget slot)
        self.notes: list[str] = [sampled] if sampled else []
        if sampled:
            self.obs.on_warning(sampled)
        self.env_faults: list[str] = []
        self.endpoint_fault: EndpointFault | None = None
        self.window_left: str | None = None  # what --timeout left undone, when not trials of the budget
        self.worker: Any = None
        self.referee = Referee(self.backend, self.deployment, self.workload, self.obs)
        self.undecided: list[int] = []  # trials whose failure waits for a configuration that works
        self.lost: Exception | None = None  # the study file vanished (tuner.study.sqlite_file)

    # -- set-up ---------------------------------------------------------------------------
    # -- one trial ------------------------------------------------------------------------
    def objective(self, trial: optuna.Trial) -> float:
        import optuna

        from tuner.search.prediction import advise

        self.worker.started(trial)
        t_trial = time.monotonic()
        config = self.space.suggest(trial)
        self.worker.wait_for_twin(trial)
        earlier = copy_source(trial.study, same_config(trial.study, config, self.fingerprint, self.tags))
        if earlier is not None:  # a sampler may propose a config again: reuse, do not relaunch
            if self.settings.sampler.lower() != "grid":
                self._queue_next(trial.study, lambda: explore(trial.study, self.space, self.settings.seed))
            return self._copy(trial, earlier)
        s = self.settings
        try:
            incumbent = sure_incumbent(trial.study)  # a lucky pass does not set it (tuner.search.boundary)
            best = None if incumbent is None else float(incumbent.value)
            noise = study_noise(trial.study, self.backend.simulated)
            advice = None
            if self.predictor is not None:
                self.obs.on_phase("predicting on the simulator")
                # a twin within the noise band of the best may be the best: it is measured
                advice = advise(trial.study.get_trials(deepcopy=False), config, self.predictor.predict(config), best,
                                twin_share=1 - noise.band(), objective=s.objective)
                if advice.prune:
                    if advice.twin_of is not None:  # the sampler proposed nothing new: the predictor does
                        self._queue_next(trial.study, lambda: propose(trial.study, self.space, self.predictor, best))
                    prune(trial, config, advice, self.run_facts, self.slos, self.named_constraints)
            tail = itl_tail(trial.study)

            def measure() -> Any:
                return evaluate_config(
                    self.backend, self.deployment, config, self.workload, self.slos,
                    load_kind=self.space.workload.load, max_replays=s.max_replays,
                    precheck=s.precheck, early_stop=s.early_stop, seed=s.seed, observer=self.obs,
                    # within the noise band of the best, a configuration is refined as a rival (in
                    # tokens/s: the bounds on what a load could reach are; goodput refines every edge)
                    incumbent=best * (1 - noise.band()) if s.early_stop and best and s.objective == "tokens" else None,
                    start_level=self._start_level(incumbent, advice),
                    expected_value=advice.expected_value if advice and s.objective == "tokens" else None,
                    edge_tolerance=s.edge_tolerance, objective=s.objective, itl_tail_s=tail,
                    start_refused=s.start_refused,
                )
            # a failure vLLM's words do not pin on a knob is judged by experiment (tuner.search.blame)
            ev = self.referee.judge(trial.study, trial.number, config, measure, self._reject(config))
            ev = self._settle(trial, config, ev, tail)  # a verdict within a start's noise of the target: a second start
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt as err:  # a signal, Ctrl-C or --timeout: nothing measured
            why = f"interrupted ({err.reason})" if isinstance(err, Interrupted) else "interrupted (Ctrl-C)"
            err.trial = trial.number  # type: ignore[attr-defined]  # for the CLI's one line
            mark_trial_failed(trial, config, self.run_facts, "interrupted", why, gpu_s=self._held(t_trial))
            raise
        except EnvironmentFault as err:  # the machine, not the configuration
            mark_trial_failed(trial, config, self.run_facts, "environment", f"{err.kind}: {err.message}",
                              gpu_s=err.gpu_s or self._held(t_trial), blame=err.blame)
            self.gpu_s += err.gpu_s  # what judging it took (the starts, the control) is the study's
            if isinstance(err, EndpointFault):  # nothing more can be measured there: the run stops now
                self.endpoint_fault = err
            raise
        except Exception as err:  # a crash fails this trial only; the study goes on
            mark_trial_failed(trial, config, self.run_facts, "crash", f"{type(err).__name__}: {err}",
                              gpu_s=self._held(t_trial))
            raise
        self.gpu_s += ev.gpu_s
        rec = ev.record.replace(run=self.run_facts.with_start(ev.record.run))
        if advice is not None and advice.prediction:
            rec = rec.replace(prediction=json_safe(advice.prediction))
        constraints = ev.named_constraints()
        if (over := sampler_constraint(rec, self.target, self.backend.simulated)) is not None:
            # met the target within a start's noise where no lower load exists: not a sure success
            constraints = {**constraints, CONSTRAINT: over}
            rec = rec.replace(boundary={"p95_ttft_s": lowest_p95(rec), "upper_p95_ttft_s": (1 + over) * self.target,
                                        "sampler_constraint": over})
        tell_constraints(trial, constraints, named=self.named_constraints)
        write(trial.set_user_attr, rec)
        return ev.value

    def _reject(self, config: ServeConfig) -> Any:
        """How the referee stores a disruption it found to be ``config``'s own."""
        def reject(err: Any, gpu_s: float) -> Any:
            rec = TrialRecord(config=config, target_ttft_s=self.target,
                              slos=() if self.slos.only_ttft else self.slos.texts)
            return rejected(rec, err, launched=True, gpu_s=gpu_s, slos=self.slos)
        return reject

    def _settle(self, trial: optuna.Trial, config: ServeConfig, ev: Any, tail: float | None) -> Any:
        """``ev``, or where its verdict lies within the study's own TTFT noise band of the target,
        that verdict weighed with a second fresh start's (:func:`tuner.search.verdict.settle`)."""
        from tuner.search.verdict import settle, study_ttft_sd

        s, rec = self.settings, ev.record

        def again() -> Any:
            self.obs.on_phase("measuring again on a second start: the verdict lies within a start's noise")
            # where the first start's search began: the two walk the same loads, so their P95s pair up
            level = next((p.level for p in rec.loads if p.level is not None and p.level < float("inf")), None)

            def measure() -> Any:
                return evaluate_config(
                    self.backend, self.deployment, config, self.workload, self.slos,
                    load_kind=self.space.workload.load, max_replays=s.max_replays, precheck=s.precheck,
                    early_stop=s.early_stop, seed=s.seed, observer=self.obs, start_level=level,
                    edge_tolerance=s.edge_tolerance, objective=s.objective, itl_tail_s=tail,
                    start_refused=s.start_refused)
            # the second start is judged as the first was (tuner.search.blame)
            return self.referee.judge(trial.study, trial.number, config, measure, self._reject(config))

        return settle(ev, again, self.target, sd=study_ttft_sd(trial.study.get_trials(deepcopy=False),
                                                              self.backend.simulated),
                      starts_vary=not self.backend.simulated, objective=s.objective)

    def _held(self, since: float) -> float:
        """Seconds the GPUs have been held by a server this trial launched (after ``since``):
        what a failed trial throws away; 0 for a backend that costs no GPU time."""
        at = getattr(self.backend, "launched_at", None)
        if not self.backend.measures_gpu_time or at is None or at < since:
            return 0.0
        return time.monotonic() - at

    def _fits(self) -> bool:
        """Whether the next trial fits in what is left of ``--timeout``, by the longest
        trial of this study that started a server (:func:`trial_estimate`); with none
        measured yet there is nothing to go by and it starts."""
        need = trial_estimate(self.study)
        return need is None or self.window.remaining() >= need

    def _queue_next(self, study: optuna.Study, queue: Callable[[], object]) -> None:
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

    def _start_level(self, incumbent: FrozenTrial | None, advice: Any) -> float | None:
        """Where the goodput search starts: the predicted load; without one, on the closed
        loop, the load the best trial so far (``incumbent``) met the target at. A
        configuration matters only where it could beat the best, and that is where it is decided:
        starting there locates the edge of a contender in the few replays a trial has, not
        the first of them spent far above it (on 2 x A100 with a 70B model, from the top a
        contender's edge came out 5 % low on average, and the study preferred a smaller
        max-num-seqs that starts next to it; benchmarks/search_noise.py)."""
        if advice is not None and advice.start_level:
            return float(advice.start_level)
        if incumbent is None or self.space.workload.load != "concurrency":
            return None
        edge = TrialRecord.from_trial(incumbent).edge
        return float(edge.level) if edge is not None and edge.level is not None else None

    def _copy(self, trial: optuna.Trial, earlier: FrozenTrial) -> float:
        """This trial measures nothing: it stores the earlier trial's measurement (not what
        the queue or the worker stamped on that one) as a repeat of it."""
        self.obs.on_phase(f"same configuration as trial {earlier.number}")
        rec = TrialRecord.from_trial(earlier)
        told = dict(rec.constraints or {CONSTRAINT: rec.constraint if rec.constraint is not None else 1.0})
        if rec.verdict:  # what the sampler was told of the earlier trial's two starts
            told[CONSTRAINT] = float(rec.verdict["constraint"])
        if rec.boundary:  # what the sampler was told of the earlier trial
            told[CONSTRAINT] = float(rec.boundary["sampler_constraint"])
        tell_constraints(trial, told, named=self.named_constraints)
        write(trial.set_user_attr, rec.replace(**{k: getattr(TrialRecord(), k) for k in QUEUED},
                                                repeat_of=earlier.number, gpu_s=0.0))
        return float(earlier.value)

    def after(self, st: optuna.Study, trial: FrozenTrial) -> None:
        """Optuna's callback after each trial: environment faults counted, progress."""
        from tuner.study import best_feasible_trial

        from tuner.study.sqlite_file import lost

        rec = TrialRecord.from_trial(trial)
        self.copies += rec.is_repeat and not rec.is_confirmation
        if (gone := lost()) is not None:  # the study file was deleted or replaced: stop before losing more
            self.lost = gone
            self.worker.halt = str(gone)
            st.stop()
            return
        if rec.fail_kind == "environment" and self.endpoint_fault is not None:
            self.worker.halt = str(self.endpoint_fault)
            st.stop()
        elif rec.fail_kind == "environment" and str(rec.fail_reason).startswith("undecided:"):
            self.undecided.append(trial.number)  # judged again once a configuration has worked
            self.obs.on_warning(f"trial {trial.number} failed, not counted: {rec.fail_reason}")
        elif rec.fail_kind == "environment":
            self.env_faults.append(str(rec.fail_reason))
            self.obs.on_warning(f"trial {trial.number} failed by the environment, not counted: {self.env_faults[-1]}")
            if len(self.env_faults) >= ENVIRONMENT_FAULTS_TO_STOP:
                self.worker.halt = self.env_faults[-1]
                st.stop()
            elif str(rec.fail_reason).startswith("killed:") and rec.retry_of is None and trial.params:
                # killed from outside: measured again once, now (the best may be the one killed)
                self._retry(st, trial)
        else:
            self.env_faults.clear()
            if rec.fail_kind == "crash":
                self.obs.on_warning(f"trial {trial.number} failed: {rec.fail_reason}")
            if rec.loads and self.undecided:  # a configuration works now: the control can judge them
                for number in self.undecided:
                    self._retry(st, st.trials[number])
                self.undecided.clear()
        self.obs.on_trial(trial, best_feasible_trial(st), count_finished(st))

    def _retry(self, st: optuna.Study, trial: FrozenTrial) -> None:
        """Queue ``trial``'s configuration again now (not counted twice: the failure was not)."""
        with self.worker.budget_guard():
            st.enqueue_trial(dict(trial.params), user_attrs=TrialRecord(retry_of=trial.number).to_attrs(),
                             skip_if_exists=False)

    # -- the run --------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        from tuner.study import best_feasible_trial, confirmation
        from tuner.study.recovery import requeue
        from tuner.study.workers import Worker

        s, st = self.settings, self.study
        if not self.backend.restarts:  # an endpoint: what runs there is the operator's, one thing to measure
            self.settings = s = replace(s, budget=min(s.budget, count_finished(st) + 1), confirm=0)
            self.notes.append(f"the {self.backend.name} backend cannot change the server's configuration: the "
                              "server is measured once per run as it is configured, and no configurations are "
                              "compared (the space's knobs were not applied)")
            self.obs.on_warning(self.notes[-1])
        interrupted: Interrupted | None = None
        with Worker(st, self.storage, budget=s.budget, timeout_s=s.timeout_s,
                    gpus=self.deployment.gpu_ids or self.deployment.gpu_count, tags=self.tags) as worker:
            self.worker = worker
            for number in worker.leftovers:
                self.obs.on_warning(f"trial {number} was left RUNNING by a run that is gone: failed as interrupted "
                                    "(not counted) and measured again")
            for g in requeue(st).given_up:
                self.notes.append(f"configuration {g['params']} failed {g['failures']} times without a measurement "
                                  f"({'; '.join(str(r) for r in g['reasons'])[:300]}); not retried")
                self.obs.on_warning(self.notes[-1])
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
            left = max(0, s.budget - count_finished(st))
            what = self.window_left or f"{left} of the budget's {s.budget} trials are"
            self.notes.append(f"--timeout: {self.window.remaining():.0f} s left, less than the "
                              f"{trial_estimate(st) or 0:.0f} s the study's longest trial took, so no trial was "
                              f"started that could not finish; {what} left for the next run (the same "
                              "command goes on)")
        if self.lost is not None:
            raise self.lost
        if self.referee.extra_starts:
            self.notes.append(self.blame_note())
        if self.endpoint_fault is not None:
            raise self.endpoint_fault
        if worker.halt is not None:
            raise EnvironmentFault("environment", f"stopped after {ENVIRONMENT_FAULTS_TO_STOP} environment faults "
                                   f"in a row (no configuration was judged by them): {worker.halt}")
        if self.env_faults and not worker.window_closed and interrupted is None:
            # the space ran out (a grid's last point) on a fault of the machine: not "no configuration met"
            raise EnvironmentFault("environment", "the run ended on an environment fault (no configuration was "
                                   f"judged by it): {self.env_faults[-1]}")
        return SearchOutcome(st, self.name, self.storage, best_feasible_trial(st), count_finished(st), worker.ran,
                             time.perf_counter() - self.t0, self.gpu_s, notes=self.notes,
                             timed_out=interrupted is not None, confirmation=confirmation(st),
                             deployment=self.deployment, target_ttft_s=self.target, backend=self.backend.name,
                             slos=self.slos.texts, copies=self.copies)

    def blame_note(self) -> str:
        """What judging failures by experiment cost this run (tuner.search.blame)."""
        r = self.referee
        share = (lambda x: f" ({x / self.gpu_s:.1%} of the study's {self.gpu_s:,.0f} s)" if self.gpu_s > 0 else "")
        return (f"whose fault a failure was took {r.extra_starts} extra start{'s' * (r.extra_starts != 1)}, "
                f"{r.gpu_s:,.0f} s of GPU time{share(r.gpu_s)}: {r.controls} control run{'s' * (r.controls != 1)} "
                f"of a configuration known to work, {r.control_gpu_s:,.0f} s{share(r.control_gpu_s)}, and failed "
                "configurations started again")

    def _confirm(self) -> None:
        """Confirm the winner once the budget is spent and nothing runs elsewhere; of
        several workers, the one that takes the study's confirm lock does it."""
        from tuner.study.locks import StudyLock
        from tuner.study.workers import budget_used

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
                confirm_winner(st, self.backend, self.deployment, self.workload, self.slos, rounds=s.confirm,
                               max_rounds=s.confirm_max, seed=s.seed, load_kind=self.space.workload.load,
                               max_replays=s.max_replays, precheck=s.precheck, edge_tolerance=s.edge_tolerance,
                               observer=self.obs, objective=s.objective, run_facts=self.run_facts, tags=self.tags,
                               feasibility_min=s.feasibility, may_start=self._fits, referee=self.referee,
                               start_refused=s.start_refused)
            except WindowFull as err:  # its repeats so far are kept: the next run goes on from them
                self.worker.window_closed = True
                self.window_left = f"the confirmation's repeats from {err} on are"
        finally:
            if lock is not None:
                lock.close()

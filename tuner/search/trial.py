"""One trial of a run (:class:`TrialObjective`, Optuna's objective): the configuration the
sampler proposes is copied from an earlier trial that measured it (``repeat_of``), pruned
on the predictor's word (:mod:`tuner.search.pruning`), or measured
(:func:`~tuner.search.objective.evaluate`), a failure vLLM's words do not pin on a
knob judged by experiment (:mod:`tuner.search.blame`) and a verdict near the target weighed
with a second start (:mod:`tuner.search.verdict`); then recorded and told to the sampler."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuner.core.errors import EndpointFault, EnvironmentFault
from tuner.core.jsonsafe import json_safe
from tuner.runtime.interrupts import Interrupted
from tuner.search.blame import itl_tail
from tuner.search.boundary import incumbent as sure_incumbent
from tuner.search.boundary import lowest_p95, sampler_constraint
from tuner.search.confirm import study_noise
from tuner.search.constraints import CONSTRAINT, tell_by_name, told
from tuner.search.objective import evaluate, rejected
from tuner.search.prediction import advise
from tuner.search.pruning import explore, propose, prune
from tuner.search.records import mark_trial_failed, same_config
from tuner.search.verdict import copy_source, settle, study_ttft_sd
from tuner.serving.config import ServeConfig
from tuner.study.record import QUEUED, TrialRecord, write

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.search.blame import Referee
    from tuner.search.objective import Evaluation
    from tuner.search.prediction import Advice
    from tuner.search.setup import Setup


class TrialObjective:
    """Optuna's objective for one run's trials, on the run's opened ``setup``: ``referee``
    judges failures, ``queue`` enqueues a next trial where the budget leaves room (the run's
    :meth:`~tuner.search.driver.SearchRun.queue_next`); ``gpu_s`` adds up what the trials held
    the GPUs, ``endpoint_fault`` keeps a server that can no longer be talked to."""

    def __init__(self, setup: Setup, referee: Referee,
                 queue: Callable[[optuna.Study, Callable[[], object]], None]) -> None:
        self.setup, self.ctx, self.referee, self.queue = setup, setup.ctx, referee, queue
        self.worker: Any = None  # the run's Worker, once it runs
        self.gpu_s = 0.0
        self.endpoint_fault: EndpointFault | None = None

    def __call__(self, trial: optuna.Trial) -> float:
        import optuna

        setup, s = self.setup, self.ctx.settings
        self.worker.started(trial)
        t_trial = time.monotonic()
        config = setup.space.suggest(trial)
        self.worker.wait_for_twin(trial)
        earlier = copy_source(trial.study, same_config(trial.study, config, setup.fingerprint, setup.tags))
        if earlier is not None:  # a sampler may propose a config again: reuse, do not relaunch
            if s.sampler.lower() != "grid":
                self.queue(trial.study, lambda: explore(trial.study, setup.space, s.seed))
            return self._copy(trial, earlier)
        try:
            ev, advice = self._measure(trial, config)
        except optuna.TrialPruned:
            raise
        except KeyboardInterrupt as err:  # a signal, Ctrl-C or --timeout: nothing measured
            why = f"interrupted ({err.reason})" if isinstance(err, Interrupted) else "interrupted (Ctrl-C)"
            err.trial = trial.number  # type: ignore[attr-defined]  # for the CLI's one line
            mark_trial_failed(trial, config, setup.run_facts, "interrupted", why, gpu_s=self._held(t_trial))
            raise
        except EnvironmentFault as err:  # the machine, not the configuration
            mark_trial_failed(trial, config, setup.run_facts, "environment", f"{err.kind}: {err.message}",
                              gpu_s=err.gpu_s or self._held(t_trial), blame=err.blame)
            self.gpu_s += err.gpu_s  # what judging it took (the starts, the control) is the study's
            if isinstance(err, EndpointFault):  # nothing more can be measured there: the run stops now
                self.endpoint_fault = err
            raise
        except Exception as err:  # a crash fails this trial only; the study goes on
            mark_trial_failed(trial, config, setup.run_facts, "crash", f"{type(err).__name__}: {err}",
                              gpu_s=self._held(t_trial))
            raise
        self.gpu_s += ev.gpu_s
        return self._record(trial, ev, advice)

    def _measure(self, trial: optuna.Trial, config: ServeConfig) -> tuple[Evaluation, Advice | None]:
        """The configuration measured (or pruned on the predictor's word: ``TrialPruned``)."""

        setup, s, ctx = self.setup, self.ctx.settings, self.ctx
        incumbent = sure_incumbent(trial.study)  # a lucky pass does not set it (tuner.search.boundary)
        best = None if incumbent is None else float(incumbent.value)
        noise = study_noise(trial.study, ctx.backend.simulated)
        advice = None
        if setup.predictor is not None:
            ctx.obs.on_phase("predicting on the simulator")
            # a twin within the noise band of the best may be the best: it is measured
            advice = advise(trial.study.get_trials(deepcopy=False), config, setup.predictor.predict(config), best,
                            twin_share=1 - noise.band(), objective=s.objective)
            if advice.prune:
                if advice.twin_of is not None:  # the sampler proposed nothing new: the predictor does
                    self.queue(trial.study, lambda: propose(trial.study, setup.space, setup.predictor, best))
                prune(trial, config, advice, setup.run_facts, ctx.slo, setup.by_name)
        tail = itl_tail(trial.study)
        tokens = s.objective == "tokens"

        def measure() -> Evaluation:
            return evaluate(
                ctx, config,
                # within the noise band of the best, a configuration is refined as a rival (in
                # tokens/s: the bounds on what a load could reach are; goodput refines every edge)
                incumbent=best * (1 - noise.band()) if s.early_stop and best and tokens else None,
                start_level=self._start_level(incumbent, advice),
                expected_value=advice.expected_value if advice and tokens else None, itl_tail_s=tail)
        # a failure vLLM's words do not pin on a knob is judged by experiment (tuner.search.blame)
        ev = self.referee.judge(trial.study, trial.number, config, measure, self._reject(config))
        return self._settle(trial, config, ev, tail), advice  # a verdict within a start's noise: a second start

    def _record(self, trial: optuna.Trial, ev: Evaluation, advice: Advice | None) -> float:
        """The trial's record written (what the sampler is told is read from it: :func:`told`)."""
        setup, target = self.setup, self.ctx.slo.target_ttft_s
        rec = ev.record.replace(run=setup.run_facts.with_start(ev.record.run))
        if advice is not None and advice.prediction:
            rec = rec.replace(prediction=json_safe(advice.prediction))
        if (over := sampler_constraint(rec, target, self.ctx.backend.simulated)) is not None:
            # met the target within a start's noise where no lower load exists: not a sure success
            rec = rec.replace(boundary={"p95_ttft_s": lowest_p95(rec), "upper_p95_ttft_s": (1 + over) * target,
                                        "sampler_constraint": over})
        if setup.by_name:
            tell_by_name(trial, told(rec))
        write(trial.set_user_attr, rec)
        return ev.value

    def _reject(self, config: ServeConfig) -> Any:
        """How the referee stores a disruption it found to be ``config``'s own."""
        slo = self.ctx.slo

        def reject(err: Any, gpu_s: float) -> Any:
            rec = TrialRecord(config=config, target_ttft_s=slo.target_ttft_s, slos=() if slo.only_ttft else slo.texts)
            return rejected(rec, err, launched=True, gpu_s=gpu_s, slos=slo)
        return reject

    def _settle(self, trial: optuna.Trial, config: ServeConfig, ev: Evaluation, tail: float | None) -> Evaluation:
        """``ev``, or where its verdict lies within the study's own TTFT noise band of the target,
        that verdict weighed with a second fresh start's (:func:`tuner.search.verdict.settle`)."""

        ctx, rec = self.ctx, ev.record

        def again() -> Evaluation:
            ctx.obs.on_phase("measuring again on a second start: the verdict lies within a start's noise")
            # where the first start's search began: the two walk the same loads, so their P95s pair up
            level = next((p.level for p in rec.loads if p.level is not None and p.level < float("inf")), None)

            def measure() -> Evaluation:
                return evaluate(ctx, config, start_level=level, itl_tail_s=tail)
            # the second start is judged as the first was (tuner.search.blame)
            return self.referee.judge(trial.study, trial.number, config, measure, self._reject(config))

        simulated = ctx.backend.simulated
        return settle(ev, again, ctx.slo.target_ttft_s, sd=study_ttft_sd(trial.study.get_trials(deepcopy=False),
                                                                         simulated),
                      starts_vary=not simulated, objective=ctx.settings.objective)

    def _held(self, since: float) -> float:
        """Seconds the GPUs have been held by a server this trial launched (after ``since``):
        what a failed trial throws away; 0 for a backend that costs no GPU time."""
        backend = self.ctx.backend
        if not backend.measures_gpu_time:
            return 0.0
        at = backend.launched_at
        if at is None or at < since:
            return 0.0
        return time.monotonic() - at

    def _start_level(self, incumbent: FrozenTrial | None, advice: Advice | None) -> float | None:
        """Where the goodput search starts: the predicted load; without one, on the closed
        loop, the load the best trial so far (``incumbent``) met the target at. A
        configuration matters only where it could beat the best, and that is where it is decided:
        starting there locates the edge of a contender in the few replays a trial has, not
        the first of them spent far above it (on 2 x A100 with a 70B model, from the top a
        contender's edge came out 5 % low on average, and the study preferred a smaller
        max-num-seqs that starts next to it; benchmarks/search_noise.py)."""
        if advice is not None and advice.start_level:
            return float(advice.start_level)
        if incumbent is None or self.ctx.load_kind != "concurrency":
            return None
        edge = TrialRecord.from_trial(incumbent).edge
        return float(edge.level) if edge is not None and edge.level is not None else None

    def _copy(self, trial: optuna.Trial, earlier: FrozenTrial) -> float:
        """This trial measures nothing: it stores the earlier trial's measurement (not what
        the queue or the worker stamped on that one) as a repeat of it, and tells the sampler
        what it was told of the earlier trial."""
        self.ctx.obs.on_phase(f"same configuration as trial {earlier.number}")
        rec = TrialRecord.from_trial(earlier)
        rec = rec.replace(**{k: getattr(TrialRecord(), k) for k in QUEUED}, repeat_of=earlier.number, gpu_s=0.0)
        if self.setup.by_name:
            tell_by_name(trial, told(rec))
        write(trial.set_user_attr, rec)
        return float(earlier.value)


__all__ = ["CONSTRAINT", "TrialObjective"]

"""Confirming a study's winner on repeats (the decision is :mod:`tuner.study.race`'s):
the candidates' repeat measurements, stored as trials of the study's companion
(:func:`tuner.study.confirmation_study`), outside the study and its budget."""
from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from tuner.core.errors import EndpointFault, EnvironmentFault
from tuner.core.urls import redact
from tuner.search.blame import itl_tail
from tuner.search.boundary import doubtful, lowest_p95, study_objective_sd
from tuner.search.objective import CONSTRAINT, evaluate, rejected
from tuner.search.verdict import start_p95, start_p95s, study_ttft_sd
from tuner.serving.config import ServeConfig
from tuner.study import confirmation, confirmation_study, count_finished, is_feasible, repeats
from tuner.study.effective import trial_group
from tuner.study.headroom import kv_filled
from tuner.study.race import Candidate, candidates, noise_floor, race
from tuner.study.record import RunFacts, TrialRecord, write_confirmation
from tuner.study.workers import identity

if TYPE_CHECKING:
    from collections.abc import Callable

    import optuna
    from optuna.trial import FrozenTrial

    from tuner.search.blame import Referee
    from tuner.search.context import TrialContext

#: Races at most, when every candidate of one misses the target on a repeat: each next
#: one takes the next-best configurations not raced yet.
MAX_WAVES = 3
#: What a repeat's record says of itself, beside its measurement.
CONFIRMATION = ("confirm_of", "confirm_round", "tags", "worker", "host", "pid", "gpus")


def config_key(config: dict[str, Any]) -> str:
    import json

    return json.dumps(config, sort_keys=True)


def cap_bound(rec: TrialRecord) -> bool:
    """Whether the most load that met the target was at or above the configuration's cap
    (max-num-seqs x replicas, or what its KV cache holds): its max-num-seqs bound."""
    edge = rec.edge
    return bool(edge is not None and edge.level is not None and edge.cap is not None
                and float(edge.level) >= float(edge.cap))  # beyond_cap: level > cap


def p95_of(rec: TrialRecord) -> float | None:
    """A measurement's P95 TTFT: at its scored load when it met the target, at its lowest
    load when it missed (what it missed by)."""
    return start_p95(rec)


def effective_key(rec: TrialRecord) -> str:
    """The configuration ``rec`` ran as the workload could tell it (:func:`tuner.study.effective.trial_group`:
    knobs without effect folded), or its whole configuration."""

    return trial_group(rec, started=True)[0] or config_key(rec.config.to_dict())


def distinct(originals: list[optuna.trial.FrozenTrial],
             records: dict[int, TrialRecord]) -> list[tuple[optuna.trial.FrozenTrial, list[int], float]]:
    """One entrant per effective configuration (:mod:`tuner.study.effective`: knobs that could
    not change throughput on this workload folded): its best-measured trial, with the
    group's trial numbers and the group's mean value (geometric; each member was its own
    start, so the mean is the group's measurement of the configuration). Trials that differ only in such knobs ran the same server as far
    as the traffic could tell: racing each would spend the race's places on one
    configuration several times (article-004's 8 x V100 space: a max-num-seqs never
    reached and a KV cache never a quarter full make eight settings one; two of a race's
    four places went to one configuration 1.6 % under the optimum while the optimum waited
    outside).

    Not the group's best: the best of k noisy starts is the luckiest of them (with the
    objective's noise of ~5 % per start, the best of three sits ~4 % over the configuration's
    value), and the configuration the sampler returned to most, because it measured well,
    would enter the race with the largest head start (benchmarks/search_noise.py: such a
    configuration 6 % under the optimum won races against it)."""  # noqa: E501
    groups: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for t in originals:
        groups.setdefault(effective_key(records[t.number]), []).append(t)  # originals have a configuration
    out = []
    for members in groups.values():
        values = [float(t.value) for t in members if t.value and t.value > 0]
        mean = statistics.geometric_mean(values) if values else 0.0
        out.append((max(members, key=lambda t: (float(t.value or 0.0), -t.number)), sorted(t.number for t in members),
                    mean))
    return out


def closeness(conf: Any) -> tuple[float, float]:
    """How near a race that nothing held came: the share of its closest candidate's
    measurements that missed the target, then its worst P95 TTFT (less is nearer)."""
    values = conf.measurements.get(conf.winner) or [0.0]
    return (sum(1 for v in values if v <= 0) / len(values), conf.worst_p95_s if conf.worst_p95_s is not None else 1e18)


def study_noise(study: optuna.Study, simulated: bool, prior: float | None = None) -> Any:
    """The study's :class:`~tuner.study.race.NoiseFloor`: the objective of every feasible
    measurement grouped by effective configuration (:mod:`tuner.study.effective`: trials that
    differ only in knobs this workload cannot tell apart ran the same server as far as
    the traffic could tell, each on its own start, so they are the study's own replicates),
    with the confirmation repeats (the companion's) in their original's group. Copies of an
    earlier trial are left out (no start of their own)."""
    from optuna.trial import TrialState

    groups: dict[str, list[float]] = {}
    records = [(t, TrialRecord.from_trial(t)) for t in study.get_trials(deepcopy=False)]
    searched = [(t, rec) for t, rec in records if not rec.is_confirmation]
    keys = {t.number: effective_key(rec) for t, rec in searched if rec.config is not None}
    for t, rec in searched + [(t, TrialRecord.from_trial(t)) for t in repeats(study)]:
        if t.state != TrialState.COMPLETE or rec.is_repeat or rec.config is None or not rec.feasible:
            continue
        group = keys.get(int(rec.confirm_of)) if rec.is_confirmation and rec.confirm_of is not None else keys.get(t.number)  # noqa: E501
        groups.setdefault(group or config_key(rec.config.to_dict()), []).append(float(t.value or 0.0))
    return noise_floor(groups.values(), simulated, prior)


#: Faults after which a race does not measure again: nothing more can be measured there.
WINDOW_FAULTS = (EndpointFault,)


class WindowFull(Exception):
    """The next repeat would not fit in what ``--timeout`` leaves (``may_start``): none is
    started only to be thrown away; the repeats measured so far are kept for the next run."""


def confirm_winner(study: optuna.Study, ctx: TrialContext, *, run_facts: RunFacts | None = None,
                   tags: dict[str, Any] | None = None, may_start: Callable[[], bool] | None = None,
                   referee: Referee | None = None) -> Any:
    """Measure the configurations within the noise band of the study's best
    ``ctx.settings.confirm`` more times each (up to ``confirm_max`` while one that differs
    from the leader in a speed knob is still tied with it, :func:`~tuner.study.race.undecided`)
    (fresh start; round r replays the requests in another order, :meth:`TrialContext.repeat`,
    and draws arrivals with seed + r; the same sample for every candidate) and store the
    decision (:mod:`tuner.study.race`) as the study's ``confirmation``. Each repeat is a
    COMPLETE trial with ``confirm_of`` in the study's companion
    (:func:`~tuner.study.confirmation_study`), outside its trials, written when measured: an
    interrupted confirmation keeps its repeats and the next run reuses them. ``may_start`` is
    asked before each repeat is started; when it says no, :class:`WindowFull` is raised. A
    repeat's failed start or disrupted replay is judged by ``referee``
    (:mod:`tuner.search.blame`): a fault of the machine is measured again, never stored as the
    candidate's repeat (two in a row stop the race). Returns the Confirmation, or None with
    no feasible trial."""

    fresh = confirmation(study)
    if fresh is not None and fresh.rounds >= ctx.settings.confirm:
        return fresh
    entrants = ConfirmRace.entrants(study, ctx.workload.fingerprint(), tags or {})
    if entrants is None:
        return None
    return ConfirmRace(study, ctx, *entrants, run_facts=run_facts, tags=tags or {}, may_start=may_start,
                       referee=referee).decide()


class ConfirmRace:
    """The race :func:`confirm_winner` runs: its candidates (one per effective configuration),
    the repeats already stored, the study's noise, and how one repeat is measured and kept."""

    @staticmethod
    def entrants(study: optuna.Study, fingerprint: str, tags: dict[str, Any],
                 ) -> tuple[list[FrozenTrial], dict[int, TrialRecord]] | None:
        """The feasible trials of this run's own (same tags and workload, not copies or
        repeats) with every trial's record; None when there is none."""

        trials = study.get_trials(deepcopy=False)
        records = {t.number: TrialRecord.from_trial(t) for t in trials}

        def original(rec: TrialRecord) -> bool:
            studied = rec.run.workload_fingerprint
            return (all(rec.tags.get(k) == v for k, v in tags.items()) and (studied or fingerprint) == fingerprint
                    and not rec.is_repeat and not rec.is_confirmation and rec.config is not None)

        originals = [t for t in trials if is_feasible(t) and original(records[t.number])]
        return (originals, records) if originals else None

    def __init__(self, study: optuna.Study, ctx: TrialContext, originals: list[FrozenTrial],
                 records: dict[int, TrialRecord], *, run_facts: RunFacts | None, tags: dict[str, Any],
                 may_start: Callable[[], bool] | None, referee: Referee | None) -> None:
        self.study, self.ctx, self.records, self.tags = study, ctx, records, tags
        self.may_start, self.referee, self.base = may_start, referee, run_facts or RunFacts()
        self.done = self._stored_repeats()
        simulated = ctx.backend.simulated
        entries = distinct(originals, records)
        # the objective's own noise (the edge moves with a start's TTFT), not the tokens/s noise
        # alone, and the study's own replicates (trials of one effective configuration); the
        # race's paired repeats lean on that
        prior = study_objective_sd((records[t.number] for t, _, _ in entries), simulated)
        self.noise = study_noise(study, simulated, prior)
        self.ttft_noise = study_ttft_sd(study.get_trials(deepcopy=False), simulated)  # what a miss is weighed against
        self.groups_of = {t.number: members for t, members, _ in entries}
        # each start's P95 (two where a verdict near the target was measured again: tuner.search.verdict)
        self.pool = [Candidate(t.number, records[t.number].config.to_dict(), [mean], cap_bound(records[t.number]),
                               *start_p95s(records[t.number]), kv_filled(records[t.number].server))
                     for t, _, mean in entries]
        # P95s at one user per replica are weighed (--feasibility) for a candidate that met the target there; a
        # repeat of one whose edge lies higher reaches it only on a miss, and those alone would be a biased sample
        self.floor_bound = {c.number for c in self.pool if lowest_p95(records[c.number]) is not None}
        self.unsure = {t.number for t, _, _ in entries if doubtful(records[t.number])}
        self.history = self._history({c.number for c in candidates(self.pool, self.noise, unsure=self.unsure)})
        self.by_number = {t.number: t for t in originals}
        self.tail = itl_tail(study)
        self.in_a_row: list[str] = []  # the machine's faults met by repeats in a row

    def _stored_repeats(self) -> dict[tuple[int, int], tuple[FrozenTrial, TrialRecord]]:
        """(trial, round) -> the repeat an earlier run stored (the companion's trials)."""
        from optuna.trial import TrialState

        return {(int(rec.confirm_of), int(rec.confirm_round or 0)): (t, rec)
                for t, rec in ((t, TrialRecord.from_trial(t)) for t in repeats(self.study))
                if rec.is_confirmation and t.state in (TrialState.COMPLETE, TrialState.FAIL)}

    def _history(self, entrants: set[int]) -> list[list[float]]:
        """Earlier races' repeats of configurations not in the first race, grouped by configuration."""
        from optuna.trial import TrialState

        groups: dict[str, list[float]] = {}
        for (number, _r), (t, rec) in self.done.items():
            if number not in entrants and t.state == TrialState.COMPLETE:
                config = rec.config
                groups.setdefault(config_key(config.to_dict() if config else {}), []).append(float(t.value or 0.0))
        return list(groups.values())

    def rounds_of(self, r: int) -> int:
        """The rounds a progress line counts to: the set ones, then the most."""
        s = self.ctx.settings
        return s.confirm if r <= s.confirm else s.confirm_max

    def judged(self, config: ServeConfig, r: int, start: float | None) -> Any:
        """One repeat measured; a fault of the machine measures it again (two in a row: raised)."""
        ctx, referee = self.ctx.repeat(r), self.referee

        def measure() -> Any:
            return evaluate(ctx, config, start_level=start, itl_tail_s=self.tail)

        def reject(err: Any, gpu_s: float) -> Any:
            return rejected(TrialRecord(config=config, target_ttft_s=ctx.slo.target_ttft_s), err,
                            launched=True, gpu_s=gpu_s, slos=ctx.slo)

        while True:
            try:
                ev = measure() if referee is None else referee.judge(self.study, None, config, measure, reject)
            except EnvironmentFault as err:
                self.in_a_row.append(f"{err.kind}: {err.message}")
                if referee is None or len(self.in_a_row) >= 2 or isinstance(err, WINDOW_FAULTS):
                    raise
                ctx.obs.on_warning(f"a confirmation repeat failed by the environment, measured again: "
                                   f"{self.in_a_row[-1]}")
                continue
            self.in_a_row.clear()
            return ev

    def measure(self, c: Candidate, r: int) -> float:
        """Candidate ``c``'s repeat ``r``: the one stored before, else measured and stored."""
        if (c.number, r) in self.done:
            return self._kept(c, r)
        if self.may_start is not None and not self.may_start():  # the window cannot hold another start
            raise WindowFull(f"trial {c.number}'s repeat {r}")
        self.ctx.obs.on_phase(f"confirming trial {c.number}: repeat {r}/{self.rounds_of(r)}")
        from optuna.trial import TrialState

        edge = self.records[c.number].edge
        start = edge.level if edge is not None and self.ctx.load_kind == "concurrency" else None
        config = ServeConfig.from_dict(c.config)
        rec = TrialRecord(confirm_of=c.number, confirm_round=r, tags=self.tags,
                          **identity(self.ctx.deployment.gpu_ids or None))
        state, value, constraint, named = TrialState.COMPLETE, 0.0, 1.0, {}
        try:
            ev = self.judged(config, r, start)
        except (KeyboardInterrupt, EnvironmentFault):
            raise  # nothing measured: not recorded against the configuration
        except Exception as err:  # the server crashed on this sample: the configuration's
            state, value = TrialState.FAIL, None
            rec = rec.replace(fail_kind="crash", fail_reason=redact(f"{type(err).__name__}: {err}")[:2000],
                              config=config)
        else:
            self.base = self.base.with_start(ev.record.run)
            c.capped = c.capped or cap_bound(ev.record)
            c.kv_full = c.kv_full or (ev.feasible and kv_filled(ev.record.server))
            rec = ev.record.replace(**{k: getattr(rec, k) for k in CONFIRMATION})
            value, constraint, named = ev.value, ev.constraint, ev.named_constraints()
        seed = self.ctx.settings.seed + r
        rec = rec.replace(run=self.base.replace(load_seed=seed, sample=f"reordered (seed {seed})"))
        self._add_p95s(c, rec)
        self._store(c, rec, state, value, named or {CONSTRAINT: float(constraint)})
        return float(value or 0.0) if rec.feasible else 0.0

    def _kept(self, c: Candidate, r: int) -> float:
        """A repeat an earlier run stored, read into the candidate."""
        from optuna.trial import TrialState

        t, kept = self.done[(c.number, r)]
        c.capped = c.capped or cap_bound(kept)
        c.kv_full = c.kv_full or (kept.feasible and kv_filled(kept.server))
        self._add_p95s(c, kept)
        return float(t.value or 0.0) if t.state == TrialState.COMPLETE and kept.feasible else 0.0

    def _add_p95s(self, c: Candidate, rec: TrialRecord) -> None:
        if (p95 := p95_of(rec)) is not None:
            c.p95s.append(p95)
        if (low := lowest_p95(rec)) is not None and c.number in self.floor_bound:
            c.floor_p95s.append(low)

    def _store(self, c: Candidate, rec: TrialRecord, state: Any, value: float | None,
               constraints: dict[str, float]) -> None:
        """The repeat as a trial of the companion study, with its constraints (by name, through
        ``create_trial``'s documented ``constraints``; no sampler reads the companion)."""
        from optuna.trial import TrialState, create_trial

        trial = self.by_number[c.number]
        complete = state == TrialState.COMPLETE
        confirmation_study(self.study, create=True).add_trial(create_trial(
            state=state, value=value, params=trial.params, distributions=trial.distributions,
            user_attrs=rec.to_attrs(), constraints=dict(constraints) if complete else None))

    def decide(self) -> Any:
        """Race in waves (a wave whose every candidate missed the target: the next-best),
        and store the decision as the study's ``confirmation``."""

        s, obs = self.ctx.settings, self.ctx.obs

        def on_round(r: int, alive: list[Candidate]) -> None:
            obs.on_phase(f"confirmed round {r}/{self.rounds_of(r)}: {len(alive)} in the race")

        conf, raced = None, set()
        for _wave in range(MAX_WAVES):
            field_ = candidates([c for c in self.pool if c.number not in raced], self.noise, unsure=self.unsure)
            if not field_:
                break
            raced |= {c.number for c in field_}
            this = race(field_, self.measure, self.noise, rounds=s.confirm, max_rounds=s.confirm_max,
                        simulated=self.ctx.backend.simulated, history=self.history, on_round=on_round,
                        target=self.ctx.slo.target_ttft_s, objective=s.objective, feasibility_min=s.feasibility,
                        prior=self.noise.rel_sd, ttft_noise=self.ttft_noise)
            if conf is not None:  # an earlier wave's candidates all missed: keep what they measured
                measured, out = {**conf.measurements, **this.measurements}, {**conf.out, **this.out}
                if not this.held:  # and the closest of the waves
                    this = min((conf, this), key=closeness)
                this.measurements, this.out = measured, out
            conf = this
            if conf.held:
                break
        if conf is None:
            return None
        conf.reason += self._reason(conf, raced)
        write_confirmation(self.study.set_user_attr, {**conf.to_dict(), "finished": count_finished(self.study)})
        return conf

    def _reason(self, conf: Any, raced: set[int]) -> str:
        """What the decision's reason adds: how many were raced (none held), or the trials
        that are the winner's configuration for this workload."""
        if not conf.held:
            return f" ({len(raced)} configuration{'s' * (len(raced) != 1)} raced)"
        same = [n for n in self.groups_of.get(conf.winner, []) if n != conf.winner]
        if not same:
            return ""
        shown = ", ".join(map(str, same[:8])) + (f" and {len(same) - 8} more" if len(same) > 8 else "")
        return (f"; trial{'s' * (len(same) > 1)} {shown} {'are' if len(same) > 1 else 'is'} the same "
                f"configuration for this workload (only knobs without effect differ)")


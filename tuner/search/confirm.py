"""Confirming a study's winner on repeats (the decision is :mod:`tuner.study.race`'s):
the candidates' repeat measurements, stored as trials of the study's companion
(:func:`tuner.study.confirmation_study`), outside the study and its budget."""
from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from tuner.core.errors import EndpointFault, EnvironmentFault
from tuner.core.urls import redact
from tuner.runtime.progress import Observer, observer_or_headless
from tuner.search.boundary import doubtful, lowest_p95, study_objective_sd
from tuner.search.constraints import CONSTRAINTS_ATTR, constraint_list
from tuner.search.goodput import EDGE_TOLERANCE, MAX_REPLAYS
from tuner.search.blame import itl_tail
from tuner.search.objective import CONSTRAINT, evaluate_config, rejected
from tuner.search.verdict import start_p95, start_p95s, study_ttft_sd
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.slo import SloSet
from tuner.study.headroom import kv_filled
from tuner.study.race import FEASIBILITY, Candidate, candidates, race
from tuner.study.record import RunFacts, TrialRecord, write_confirmation

if TYPE_CHECKING:
    from collections.abc import Callable

    import optuna

    from tuner.search.backend import Backend
    from tuner.search.blame import Referee
    from tuner.traffic.workload import Workload

#: Repeat measurements per candidate when confirming a study's winner (``--confirm``).
CONFIRM_ROUNDS = 2
#: Rounds a race may go on to while a candidate that differs from the leader in a speed
#: knob is still tied with it (``--confirm-max``).
CONFIRM_MAX_ROUNDS = 5
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
    from tuner.study.effective import trial_group

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
    configuration 6 % under the optimum won races against it)."""
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

    from tuner.study import repeats
    from tuner.study.race import noise_floor

    groups: dict[str, list[float]] = {}
    records = [(t, TrialRecord.from_trial(t)) for t in study.get_trials(deepcopy=False)]
    searched = [(t, rec) for t, rec in records if not rec.is_confirmation]
    keys = {t.number: effective_key(rec) for t, rec in searched if rec.config is not None}
    for t, rec in searched + [(t, TrialRecord.from_trial(t)) for t in repeats(study)]:
        if t.state != TrialState.COMPLETE or rec.is_repeat or rec.config is None or not rec.feasible:
            continue
        group = keys.get(int(rec.confirm_of)) if rec.is_confirmation and rec.confirm_of is not None else keys.get(t.number)
        groups.setdefault(group or config_key(rec.config.to_dict()), []).append(float(t.value or 0.0))
    return noise_floor(groups.values(), simulated, prior)


#: Faults after which a race does not measure again: nothing more can be measured there.
WINDOW_FAULTS = (EndpointFault,)


class WindowFull(Exception):
    """The next repeat would not fit in what ``--timeout`` leaves (``may_start``): none is
    started only to be thrown away; the repeats measured so far are kept for the next run."""


def confirm_winner(
    study: optuna.Study, backend: Backend, deployment: Deployment, workload: Workload, target: float | SloSet, *, objective: str = "tokens",
    rounds: int = CONFIRM_ROUNDS, max_rounds: int = CONFIRM_MAX_ROUNDS, seed: int = 0, load_kind: str = "concurrency", max_replays: int = MAX_REPLAYS,
    precheck: bool = True, edge_tolerance: float = EDGE_TOLERANCE, observer: Observer | None = None,
    run_facts: RunFacts | None = None, tags: dict[str, Any] | None = None, feasibility_min: float = FEASIBILITY,
    may_start: Callable[[], bool] | None = None, referee: Referee | None = None, start_refused: bool = False,
) -> Any:
    """Measure the configurations within the noise band of the study's best ``rounds``
    more times each (up to ``max_rounds`` while one that differs from the leader in a
    speed knob is still tied with it, :func:`~tuner.study.race.undecided`) (fresh start; round r replays the requests in another order,
    :meth:`Workload.reordered`, and draws arrivals with seed + r; the same sample for
    every candidate) and store the decision (:mod:`tuner.study.race`) as the study's
    ``confirmation``. Each repeat is a COMPLETE trial with ``confirm_of`` in the study's
    companion (:func:`~tuner.study.confirmation_study`), outside its trials, written when measured: an interrupted confirmation keeps its repeats and
    the next run reuses them. ``may_start`` is asked before each repeat is started; when it
    says no, :class:`WindowFull` is raised. A repeat's failed start or disrupted replay is
    judged by ``referee`` (:mod:`tuner.search.blame`): a fault of the machine is measured
    again, never stored as the candidate's repeat (two in a row stop the race). Returns the
    Confirmation, or None with no feasible trial."""
    from optuna.trial import TrialState, create_trial

    from tuner.study import confirmation, confirmation_study, count_finished, is_feasible, repeats
    from tuner.study.workers import identity

    obs = observer_or_headless(observer)
    fresh = confirmation(study)
    if fresh is not None and fresh.rounds >= rounds:
        return fresh
    trials = study.get_trials(deepcopy=False)
    records = {t.number: TrialRecord.from_trial(t) for t in trials}
    tags = tags or {}
    fingerprint = workload.fingerprint()

    def original(rec: TrialRecord) -> bool:
        """A measurement of this run's own (same tags, same workload), not a copy or a repeat."""
        studied = rec.run.workload_fingerprint
        return (all(rec.tags.get(k) == v for k, v in tags.items()) and (studied or fingerprint) == fingerprint
                and not rec.is_repeat and not rec.is_confirmation and rec.config is not None)

    originals = [t for t in trials if is_feasible(t) and original(records[t.number])]
    if not originals:
        return None
    done = {(int(rec.confirm_of), int(rec.confirm_round or 0)): (t, rec)  # numbers of the companion's own
            for t, rec in ((t, TrialRecord.from_trial(t)) for t in repeats(study))
            if rec.is_confirmation and t.state in (TrialState.COMPLETE, TrialState.FAIL)}
    entries = distinct(originals, records)
    # the objective's own noise (the edge moves with a start's TTFT), not the tokens/s noise
    # alone, and the study's own replicates (trials of one effective configuration); the
    # race's paired repeats lean on that
    prior = study_objective_sd((records[t.number] for t, _, _ in entries), backend.simulated)
    noise = study_noise(study, backend.simulated, prior)
    ttft_noise = study_ttft_sd(trials, backend.simulated)  # what a miss is weighed against in the race
    groups_of = {t.number: members for t, members, _ in entries}
    # each start's P95 (two where a verdict near the target was measured again: tuner.search.verdict)
    pool = [Candidate(t.number, records[t.number].config.to_dict(), [mean], cap_bound(records[t.number]),
                      *start_p95s(records[t.number]), kv_filled(records[t.number].server)) for t, _, mean in entries]
    # P95s at one user per replica are weighed (--feasibility) for a candidate that met the target there; a
    # repeat of one whose edge lies higher reaches it only on a miss, and those alone would be a biased sample
    floor_bound = {c.number for c in pool if lowest_p95(records[c.number]) is not None}
    unsure = {t.number for t, _, _ in entries if doubtful(records[t.number])}
    entrants = {c.number for c in candidates(pool, noise, unsure=unsure)}  # the first race's: their repeats are its own
    history = []
    groups: dict[str, list[float]] = {}
    for (number, _r), (t, rec) in done.items():
        if number not in entrants and t.state == TrialState.COMPLETE:
            config = rec.config
            groups.setdefault(config_key(config.to_dict() if config else {}), []).append(float(t.value or 0.0))
    history = list(groups.values())
    by_number = {t.number: t for t in originals}
    base = run_facts or RunFacts()

    def of(r: int) -> int:  # the rounds a progress line counts to: the set ones, then the most
        return rounds if r <= rounds else max_rounds

    tail = itl_tail(study)
    in_a_row: list[str] = []  # the machine's faults met by repeats in a row

    def judged(config: ServeConfig, r: int, start: float | None) -> Any:
        """One repeat measured; a fault of the machine measures it again (two in a row: raised)."""
        def evaluate() -> Any:
            return evaluate_config(backend, deployment, config, workload.reordered(seed + r), target,
                                   load_kind=load_kind, max_replays=max_replays, precheck=precheck, seed=seed + r,
                                   observer=obs, start_level=start, edge_tolerance=edge_tolerance,
                                   objective=objective, itl_tail_s=tail, start_refused=start_refused)

        def reject(err: Any, gpu_s: float) -> Any:
            return rejected(TrialRecord(config=config, target_ttft_s=SloSet.of(target).target_ttft_s), err,
                            launched=True, gpu_s=gpu_s, slos=SloSet.of(target))

        while True:
            try:
                ev = evaluate() if referee is None else referee.judge(study, None, config, evaluate, reject)
            except EnvironmentFault as err:
                in_a_row.append(f"{err.kind}: {err.message}")
                if referee is None or len(in_a_row) >= 2 or isinstance(err, WINDOW_FAULTS):
                    raise
                obs.on_warning(f"a confirmation repeat failed by the environment, measured again: {in_a_row[-1]}")
                continue
            in_a_row.clear()
            return ev

    def measure(c: Candidate, r: int) -> float:
        nonlocal base
        if (c.number, r) in done:
            t, kept = done[(c.number, r)]
            c.capped = c.capped or cap_bound(kept)
            c.kv_full = c.kv_full or (kept.feasible and kv_filled(kept.server))
            if (p95 := p95_of(kept)) is not None:
                c.p95s.append(p95)
            if (low := lowest_p95(kept)) is not None and c.number in floor_bound:
                c.floor_p95s.append(low)
            return float(t.value or 0.0) if t.state == TrialState.COMPLETE and kept.feasible else 0.0
        if may_start is not None and not may_start():  # the window cannot hold another start
            raise WindowFull(f"trial {c.number}'s repeat {r}")
        obs.on_phase(f"confirming trial {c.number}: repeat {r}/{of(r)}")
        edge = records[c.number].edge
        start = edge.level if edge is not None and load_kind == "concurrency" else None
        config = ServeConfig.from_dict(c.config)
        rec = TrialRecord(confirm_of=c.number, confirm_round=r, tags=tags, **identity(deployment.gpu_ids or None))
        state = TrialState.COMPLETE
        value: float | None = 0.0
        constraint = 1.0
        named: dict[str, float] = {}
        try:
            ev = judged(config, r, start)
        except (KeyboardInterrupt, EnvironmentFault):
            raise  # nothing measured: not recorded against the configuration
        except Exception as err:  # the server crashed on this sample: the configuration's
            state, value = TrialState.FAIL, None
            rec = rec.replace(fail_kind="crash", fail_reason=redact(f"{type(err).__name__}: {err}")[:2000],
                              config=config)
        else:
            base = base.with_start(ev.record.run)
            c.capped = c.capped or cap_bound(ev.record)
            c.kv_full = c.kv_full or (ev.feasible and kv_filled(ev.record.server))
            rec = ev.record.replace(**{k: getattr(rec, k) for k in CONFIRMATION})
            value, constraint, named = ev.value, ev.constraint, ev.named_constraints()
        rec = rec.replace(run=base.replace(load_seed=seed + r, sample=f"reordered (seed {seed + r})"))
        if (p95 := p95_of(rec)) is not None:
            c.p95s.append(p95)
        if (low := lowest_p95(rec)) is not None and c.number in floor_bound:
            c.floor_p95s.append(low)
        trial = by_number[c.number]
        companion = confirmation_study(study, create=True)
        told = constraint_list(named or {CONSTRAINT: float(constraint)})
        companion.add_trial(create_trial(  # constraints as the list optuna-dashboard reads (tuner.search.constraints)
            state=state, value=value, params=trial.params, distributions=trial.distributions,
            user_attrs=rec.to_attrs(), system_attrs={CONSTRAINTS_ATTR: told} if state == TrialState.COMPLETE else None))
        return float(value or 0.0) if rec.feasible else 0.0

    def on_round(r: int, alive: list[Candidate]) -> None:
        obs.on_phase(f"confirmed round {r}/{of(r)}: {len(alive)} in the race")

    conf, raced = None, set()
    for _wave in range(MAX_WAVES):  # a wave whose every candidate missed the target: the next-best
        field_ = candidates([c for c in pool if c.number not in raced], noise, unsure=unsure)
        if not field_:
            break
        raced |= {c.number for c in field_}
        this = race(field_, measure, noise, rounds=rounds, max_rounds=max_rounds, simulated=backend.simulated,
                    history=history, on_round=on_round, target=SloSet.of(target).target_ttft_s, objective=objective,
                    feasibility_min=feasibility_min, prior=noise.rel_sd, ttft_noise=ttft_noise)
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
    if not conf.held:
        conf.reason += f" ({len(raced)} configuration{'s' * (len(raced) != 1)} raced)"
    elif same := [n for n in groups_of.get(conf.winner, []) if n != conf.winner]:
        shown = ", ".join(map(str, same[:8])) + (f" and {len(same) - 8} more" if len(same) > 8 else "")
        conf.reason += (f"; trial{'s' * (len(same) > 1)} {shown} {'are' if len(same) > 1 else 'is'} the same "
                        f"configuration for this workload (only knobs without effect differ)")
    write_confirmation(study.set_user_attr, {**conf.to_dict(), "finished": count_finished(study)})
    return conf

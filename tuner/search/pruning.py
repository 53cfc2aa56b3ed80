"""What the search does with the simulator's prediction of a configuration: prune it
without a launch, or propose the best neighbour when the sampler proposed a twin."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.core.jsonsafe import json_safe
from tuner.search.constraints import CONSTRAINT, tell_by_name
from tuner.search.defaults import snapped_grid
from tuner.search.prediction import advise
from tuner.serving.config import ServeConfig
from tuner.study import best_feasible_trial
from tuner.study.record import RunFacts, TrialRecord, write

if TYPE_CHECKING:
    import optuna

    from tuner.search.prediction import Advice, Predictor
    from tuner.serving.slo import SloSet
    from tuner.space import SearchSpace


def untried_neighbours(study: optuna.Study, space: SearchSpace) -> list[dict]:
    """The trial params one knob (or the layout) away from the best feasible trial's that
    no trial of ``study`` has, in the space's grid order; empty with no feasible trial."""

    incumbent = best_feasible_trial(study)
    if incumbent is None:
        return []
    tried = {tuple(sorted(t.params.items())) for t in study.get_trials(deepcopy=False)}
    out = []
    for key, values in snapped_grid(space).items():
        for value in values:
            params = {**incumbent.params, key: value}
            if tuple(sorted(params.items())) not in tried:
                out.append(params)
    return out


def propose(study: optuna.Study, space: SearchSpace, predictor: Predictor, best: float | None) -> None:
    """Enqueue, as the next trial, the neighbour of the best trial (one knob or the layout
    changed) that the predictor expects most of, among those it would launch (no predicted
    twin of a measured trial, nothing under the pruning share of the best, not tried)."""

    trials = study.get_trials(deepcopy=False)
    scored = []
    for params in untried_neighbours(study, space):
        config = space.config_from_params(params)
        advice = advise(trials, config, predictor.predict(config), best)
        if advice.prediction and not advice.prune:
            scored.append((advice.expected_value or advice.prediction.get("tokens_per_s") or 0.0, params))
    if scored:
        study.enqueue_trial(max(scored, key=lambda x: x[0])[1],
                            user_attrs=TrialRecord(proposed_by="predictor").to_attrs(), skip_if_exists=True)


def explore(study: optuna.Study, space: SearchSpace, seed: int) -> bool:
    """Enqueue, as the next trial, an untried neighbour of the best trial (one knob or the
    layout changed), drawn at random (seeded by ``seed`` and the trial count): when the
    sampler proposes a configuration already measured, that trial is a copy that measures
    nothing, and the budget slot it took goes to the best trial's neighbourhood instead.
    (TPE re-proposed up to 16 of 40 trials on the 120-configuration V100 space of
    benchmarks/search_noise.py.) False when every neighbour was tried."""
    import numpy as np

    untried = untried_neighbours(study, space)
    if not untried:
        return False
    draw = np.random.default_rng([seed, len(study.get_trials(deepcopy=False))])
    pick = untried[int(draw.integers(len(untried)))]
    study.enqueue_trial(pick, user_attrs=TrialRecord(proposed_by="neighbour of the best").to_attrs(),
                        skip_if_exists=True)
    return True


def pruned_constraints(study: optuna.Study, advice: Advice, slos: SloSet) -> dict[str, float]:
    """The Optuna constraints of a trial pruned on ``advice``, one per SLO of ``slos`` (as
    a measured trial carries), so the sampler's feasibility model sees every SLO: a
    predicted twin's are what the twin measured; otherwise the prediction's own (at the
    predicted load), and for an SLO the prediction does not cover, P95 TTFT from its
    ``p95_ttft_s`` when predicted feasible, else 1.0 (nothing measured)."""
    out = slos.constraints(None)
    if advice.twin_of is not None:
        twin = TrialRecord.from_trial(study.get_trials(deepcopy=False)[advice.twin_of])
        measured = dict(twin.constraints) or ({CONSTRAINT: twin.constraint} if twin.constraint is not None else {})
        if all(n in measured for n in out):
            return {n: float(measured[n]) for n in out}
    pred = advice.prediction
    p95, target = pred.get("p95_ttft_s"), slos.target_ttft_s
    if pred.get("feasible") and p95 and target and CONSTRAINT in out:
        out[CONSTRAINT] = p95 / target - 1.0
    out.update({n: float(v) for n, v in (pred.get("constraints") or {}).items() if n in out})
    return out


def prune(trial: optuna.Trial, config: ServeConfig, advice: Advice, run_facts: RunFacts, slos: SloSet,
          by_name: bool = False) -> None:
    """Record a configuration the predictor ruled out, without launching it: PRUNED,
    with the prediction as evidence (TPE ranks pruned trials below every measured one)
    and one constraint per SLO of ``slos`` (:func:`pruned_constraints`) in its record, which
    the sampler reads (told by name where ``by_name``: :mod:`tuner.search.constraints`)."""
    import optuna

    constraints = pruned_constraints(trial.study, advice, slos)
    if by_name:
        tell_by_name(trial, constraints)
    write(trial.set_user_attr, TrialRecord(config=config, prediction=json_safe(advice.prediction),
                                           pruned_reason=advice.reason, constraints=constraints,
                                           feasible=False, gpu_s=0.0, run=run_facts, twin_of=advice.twin_of))
    trial.report(float(advice.value), step=0)
    raise optuna.TrialPruned(advice.reason)

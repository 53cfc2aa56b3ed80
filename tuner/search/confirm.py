"""Confirming a study's winner on repeats (the decision is :mod:`tuner.confirmation`'s):
the candidates' repeat measurements, stored as trials outside the budget."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.config import Deployment, ServeConfig
from tuner.errors import EnvironmentFault
from tuner.jsonsafe import json_safe
from tuner.search.goodput import EDGE_TOLERANCE, MAX_REPLAYS
from tuner.search.objective import CONSTRAINT, evaluate_config
from tuner.search.progress import SearchObserver
from tuner.urls import redact

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.backends.base import Backend
    from tuner.traffic.workload import Workload

#: Repeat measurements per candidate when confirming a study's winner (``--confirm``).
CONFIRM_ROUNDS = 2


def config_key(config: dict[str, Any]) -> str:
    import json

    return json.dumps(config, sort_keys=True)


def study_noise(study: optuna.Study, backend: str) -> Any:
    """The study's :class:`~tuner.confirmation.NoiseFloor`: tokens/s of every feasible
    measurement grouped by configuration (copies of an earlier trial left out, so only
    confirmation repeats make a group of more than one)."""
    from optuna.trial import TrialState

    from tuner.confirmation import noise_floor

    groups: dict[str, list[float]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        a = t.user_attrs
        if "repeat_of" in a or "config" not in a or not a.get("feasible"):
            continue
        groups.setdefault(config_key(a["config"]), []).append(float(t.value or 0.0))
    return noise_floor(groups.values(), backend)


def confirm_winner(
    study: optuna.Study, backend: Backend, deployment: Deployment, workload: Workload, target: float, *,
    rounds: int = CONFIRM_ROUNDS, seed: int = 0, load_kind: str = "concurrency", max_replays: int = MAX_REPLAYS,
    precheck: bool = True, edge_tolerance: float = EDGE_TOLERANCE, observer: SearchObserver | None = None,
    run_facts: dict[str, Any] | None = None, tags: dict[str, Any] | None = None,
) -> Any:
    """Measure the configurations within the noise band of the study's best ``rounds``
    more times each (fresh start; round r replays the requests in another order,
    :meth:`Workload.reordered`, and draws arrivals with seed + r; the same sample for
    every candidate) and store the decision (:mod:`tuner.confirmation`) as the study's
    ``confirmation``. Each repeat is a COMPLETE trial with ``confirm_of`` outside the
    budget, written when measured: an interrupted confirmation keeps its repeats and
    the next run reuses them. Returns the Confirmation, or None with no feasible trial."""
    from optuna.trial import TrialState, create_trial

    from tuner.confirmation import Candidate, candidates, race
    from tuner.study import confirmation, count_finished, is_feasible
    from tuner.workers import identity

    obs = observer or SearchObserver()
    fresh = confirmation(study)
    if fresh is not None and fresh.rounds >= rounds:
        return fresh
    trials = study.get_trials(deepcopy=False)
    tags = tags or {}
    fingerprint = workload.fingerprint()

    def ours(t: FrozenTrial) -> bool:
        a = t.user_attrs
        return (all(a.get(k) == v for k, v in tags.items())
                and (a.get("run") or {}).get("workload_fingerprint", fingerprint) == fingerprint)

    originals = [t for t in trials if is_feasible(t) and ours(t) and "repeat_of" not in t.user_attrs
                 and "confirm_of" not in t.user_attrs and "config" in t.user_attrs]
    if not originals:
        return None
    done = {(int(t.user_attrs["confirm_of"]), int(t.user_attrs.get("confirm_round", 0))): t
            for t in trials if "confirm_of" in t.user_attrs and t.state in (TrialState.COMPLETE, TrialState.FAIL)}
    noise = study_noise(study, backend.name)
    field_ = candidates([Candidate(t.number, dict(t.user_attrs["config"]), [float(t.value or 0.0)])
                         for t in originals], noise)
    entrants = {c.number for c in field_}
    history = []
    groups: dict[str, list[float]] = {}
    for (number, _r), t in done.items():
        if number not in entrants and t.state == TrialState.COMPLETE:
            groups.setdefault(config_key(t.user_attrs.get("config") or {}), []).append(float(t.value or 0.0))
    history = list(groups.values())
    by_number = {t.number: t for t in originals}
    base = dict(run_facts or {})

    def measure(c: Candidate, r: int) -> float:
        if (c.number, r) in done:
            t = done[(c.number, r)]
            return float(t.value or 0.0) if t.state == TrialState.COMPLETE and t.user_attrs.get("feasible") else 0.0
        original = by_number[c.number]
        obs.on_phase(f"confirming trial {c.number}: repeat {r}/{rounds}")
        edge = (original.user_attrs.get("edge") or {}).get("level")
        config = ServeConfig.from_dict(c.config)
        attrs: dict[str, Any] = {"confirm_of": c.number, "confirm_round": r, **identity(deployment.gpu_ids or None),
                                 **tags}
        state = TrialState.COMPLETE
        value: float | None = 0.0
        constraint = 1.0
        try:
            ev = evaluate_config(backend, deployment, config, workload.reordered(seed + r), target,
                                 load_kind=load_kind, max_replays=max_replays, precheck=precheck, seed=seed + r,
                                 phase=obs.on_phase, start_level=edge if load_kind == "concurrency" else None,
                                 edge_tolerance=edge_tolerance)
        except (KeyboardInterrupt, EnvironmentFault):
            raise  # nothing measured: not recorded against the configuration
        except Exception as err:  # the server crashed on this sample: the configuration's
            state, value = TrialState.FAIL, None
            attrs.update(fail_kind="crash", fail_reason=redact(f"{type(err).__name__}: {err}")[:2000],
                         config=c.config)
        else:
            moved = {k: ev.attrs[k] for k in ("vllm_version", "log_paths", "startup_s", "plan") if k in ev.attrs}
            attrs.update({k: v for k, v in ev.attrs.items() if k not in moved})
            base.update(moved)
            value, constraint = ev.value, ev.constraint
        attrs["run"] = {**base, "load_seed": seed + r, "sample": f"reordered (seed {seed + r})"}
        study.add_trial(create_trial(
            state=state, value=value, params=original.params, distributions=original.distributions,
            user_attrs={k: json_safe(v) for k, v in attrs.items()},
            constraints={CONSTRAINT: float(constraint)} if state == TrialState.COMPLETE else None))
        return float(value or 0.0) if attrs.get("feasible") else 0.0

    def on_round(r: int, alive: list[Candidate]) -> None:
        obs.on_phase(f"confirmed round {r}/{rounds}: {len(alive)} in the race")

    conf = race(field_, measure, noise, rounds=rounds, backend=backend.name, history=history, on_round=on_round)
    study.set_user_attr("confirmation", {**conf.to_dict(), "finished": count_finished(study)})
    return conf

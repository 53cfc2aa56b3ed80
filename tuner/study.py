"""Studies are Optuna's: this module names them, finds their storage, and reads the
trials the search wrote (see ``tuner.search`` for what each trial stores).

Storage defaults to ``sqlite:///studies/<name>.db`` (one file per study, relative to the
working directory); any SQLAlchemy URL works (``postgresql://...`` lets several
``tuner search`` workers share one study). Every trial keeps its results in
``trial.user_attrs``, read through :class:`tuner.record.TrialRecord`: ``feasible`` says
whether the configuration met the TTFT target and ``constraint`` repeats Optuna's
constraint value (<= 0 feasible).

Budget: ``--budget N`` counts the study's *finished* trials, whatever their state
(COMPLETE, PRUNED, FAIL); infeasible configurations are COMPLETE trials with a
violated constraint. Trials left RUNNING by a killed process are not counted.
On a server database (``postgresql://``) several workers share the budget, and trials
running on other workers count too; see :mod:`tuner.workers`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import InputError
from tuner.record import StudyRecord, TrialRecord
from tuner.storage import (STUDIES_DIR, check_study_name, opened, optuna_storage, storage_fault, storage_of,
                           storage_open_error)

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.config import Deployment, ServeConfig

def study_name(deployment: Deployment, workload_fingerprint: str, space_name: str = "default",
               backend: str = "sim", target_ttft_s: float | None = None, slos: str = "") -> str:
    """``1xH100-SXM.qwen2.5-7b.default.3f9a1c2b.ttft2s``: deployment label, space, workload
    fingerprint (first 8 hex digits), the P95 TTFT target (feasibility depends on it, so
    two targets never share a study), and the backend unless it is the simulator (so a
    real study and its simulator warm start stay apart). ``slos`` (:meth:`tuner.slo.SloSet.key`)
    names the service levels beyond P95 TTFT: another set is another study. Safe as a file name."""
    raw = f"{deployment.label()}.{space_name}.{workload_fingerprint[:8]}"
    if target_ttft_s is not None:
        raw += f".ttft{target_ttft_s:g}s"
    raw += slos
    if backend != "sim":
        raw += f".{backend}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw)


def finished_states() -> tuple[Any, ...]:
    from optuna.trial import TrialState

    return (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


#: Copies (a configuration the study measured before, proposed again: recorded from that
#: measurement, no server started) take no slot of ``--budget``, up to this many per study;
#: past it each does, so the loop ends even on a space with fewer configurations than the budget.
FREE_COPIES = 40


def count_finished(study: optuna.Study) -> int:
    """Trials that count against ``--budget``: finished, except failures that measured
    nothing (interrupted, environment faults: :mod:`tuner.recovery`) and, up to
    :data:`FREE_COPIES`, copies of a configuration measured before."""
    trials = study.get_trials(deepcopy=False, states=finished_states())
    counted = [t for t in trials if counts_toward_budget(t)]
    return len(counted) - free_copies(sum(1 for t in counted if is_copy(t)))


def counts_toward_budget(trial: Any) -> bool:
    """Whether one finished trial is counted by :func:`count_finished` before the copies
    it lets go free (:func:`free_copies`)."""
    from tuner.recovery import not_measured

    return not not_measured(trial) and not is_confirmation(trial)


def is_copy(trial: Any) -> bool:
    """A trial that measured nothing new: the sampler proposed a configuration the study
    measured before, and the trial holds that measurement (``repeat_of``)."""
    rec = TrialRecord.from_trial(trial)
    return rec.is_repeat and not rec.is_confirmation


def free_copies(copies: int) -> int:
    """How many of a study's ``copies`` take no budget slot."""
    return min(copies, FREE_COPIES)


def copy_slots(study: optuna.Study) -> int:
    """Budget slots the study's copies took (0 until it has more than :data:`FREE_COPIES`)."""
    trials = study.get_trials(deepcopy=False, states=finished_states())
    copies = sum(1 for t in trials if counts_toward_budget(t) and is_copy(t))
    return copies - free_copies(copies)


def is_confirmation(trial: Any) -> bool:
    """A repeat measurement of an earlier trial's configuration made to confirm the
    study's winner (:mod:`tuner.confirmation`): not sampled, not counted in the budget."""
    return TrialRecord.from_trial(trial).is_confirmation


#: What a study's companion is named after it (``<name>.confirm``): the study, in the same
#: storage, that holds the repeats confirming its winner (:func:`confirmation_study`).
COMPANION_SUFFIX = ".confirm"


def companion_name(name: str) -> str:
    """The name of study ``name``'s companion (:data:`COMPANION_SUFFIX`)."""
    return name + COMPANION_SUFFIX


def own_studies(names: list[str]) -> list[str]:
    """``names`` (a storage's studies, in its order) without the companions of studies among
    them: what ``tuner studies`` lists and a storage's "only" or "newest" study is one of."""
    present = set(names)
    return [n for n in names if not (n.endswith(COMPANION_SUFFIX) and n[: -len(COMPANION_SUFFIX)] in present)]


def _storage_of(study: optuna.Study) -> Any:
    """The storage ``study`` was opened on; its companion is opened on the same one (the same
    database, connection and cache: also a read-only file, or a server shared by workers)."""
    handle = storage_of(study)  # the one tuner opened it with
    # a study a user opened with optuna itself: Optuna keeps no public handle to its storage
    return handle if handle is not None else study._storage  # noqa: SLF001


def confirmation_study(study: optuna.Study, *, create: bool = False) -> optuna.Study | None:
    """The companion study holding ``study``'s confirmation repeats (:data:`COMPANION_SUFFIX`),
    or None when it has none. ``create``: make it when missing and link it from the study
    (:attr:`~tuner.record.StudyRecord.confirmation_study`), as the confirmation does before its
    first repeat."""
    import optuna

    from tuner.record import write_confirmation

    linked = StudyRecord.from_study(study).confirmation_study
    if linked is None and not create:
        return None
    name = linked or companion_name(study.study_name)
    if create:
        companion = optuna.create_study(study_name=name, storage=_storage_of(study), direction="maximize",
                                        load_if_exists=True)
        if linked is None:
            companion.set_user_attr("confirmation_of", study.study_name)
            write_confirmation(study.set_user_attr, companion=name)
        return name_objective(companion)
    try:
        return optuna.load_study(study_name=name, storage=_storage_of(study))
    except KeyError:  # linked, but removed by hand
        return None


def repeats(study: optuna.Study) -> list[FrozenTrial]:
    """The repeat measurements confirming ``study``'s winner: its companion's trials, and those
    a study written before the companion existed holds among its own (``confirm_of`` set:
    read as repeats, never as configurations). Each names its trial (``confirm_of``, a trial
    number of ``study``) and round (``confirm_round``)."""
    legacy = [t for t in study.get_trials(deepcopy=False) if is_confirmation(t)]
    companion = confirmation_study(study)
    return legacy + ([] if companion is None else companion.get_trials(deepcopy=False))


def delete_study(name: str, storage: str | None = None) -> None:
    """Delete study ``name`` and its companion (:func:`confirmation_study`) from ``storage``."""
    import optuna

    st = load_study_by_name(name, storage)
    companion = confirmation_study(st)
    store = _storage_of(st)
    if companion is not None:
        optuna.delete_study(study_name=companion.study_name, storage=store)
    optuna.delete_study(study_name=name, storage=store)


def open_study(name: str, storage: str | None = None, *, sampler: Any = None) -> optuna.Study:
    """Create the study, or load it when it exists (resume)."""
    import optuna

    from tuner.urls import redact

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_study_name(name)
    shown = redact(storage) if storage else f"sqlite:///{STUDIES_DIR / name}.db"
    try:
        store = optuna_storage(storage, name)
        return name_objective(opened(optuna.create_study(
            study_name=name, storage=store, sampler=sampler, direction="maximize", load_if_exists=True,
        ), store))
    except (ImportError, ValueError, TypeError) as err:  # bad URL, missing driver
        raise storage_open_error(err, shown) from err  # type: ignore[misc]  # never None for these
    except OSError as err:  # the studies/ folder cannot be made or written
        from tuner.files import write_fault

        raise write_fault(Path(err.filename or STUDIES_DIR), err) from err
    except Exception as err:
        fault = storage_fault(err, shown) or storage_open_error(err, shown)
        if fault is not None:
            raise fault from err
        raise


#: The objective's name, as optuna-dashboard and ``optuna.load_study(...).metric_names`` show it.
METRIC_NAMES = ["tokens_per_s"]


def name_objective(study: optuna.Study) -> optuna.Study:
    """Name the study's objective (:data:`METRIC_NAMES`; "Objective 0" otherwise), once."""
    import warnings

    import optuna

    if study.metric_names != METRIC_NAMES:
        with warnings.catch_warnings():  # set_metric_names is experimental since Optuna 3.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(METRIC_NAMES)
    return study


def load_study_by_name(name: str, storage: str | None = None) -> optuna.Study:
    """An existing study; ``InputError`` listing the known ones when absent."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_study_name(name)
    if storage is None:
        path = STUDIES_DIR / f"{name}.db"
        if not STUDIES_DIR.is_dir():
            raise InputError(f"no study {name!r}: there is no {STUDIES_DIR}/ folder in {Path.cwd()}, so no study "
                             "was run from here", hint="run tuner in the folder tuner search ran in, or give --storage")
        if not path.is_file():
            known = ", ".join(s.name for s in list_studies()) or "none"
            raise InputError(f"no study {name!r} in {STUDIES_DIR}/", hint=f"known studies: {known}")
    try:
        store = optuna_storage(storage, name)
        return opened(optuna.load_study(study_name=name, storage=store), store)
    except KeyError as err:
        known = ", ".join(own_studies(optuna.get_all_study_names(optuna_storage(storage, name)))) if storage else ""
        raise InputError(f"no study {name!r} in {storage}", hint=f"known studies: {known or 'none'}") from err


@dataclass(frozen=True, slots=True)
class StudySummary:
    name: str
    storage: str
    finished: int
    feasible: int
    best_value: float | None
    best_trial: int | None
    objective: str | None = None  #: what ``best_value`` scores (:data:`tuner.slo.OBJECTIVES`)


def summarize(study: optuna.Study, storage: str) -> StudySummary:
    trials = study.get_trials(deepcopy=False, states=finished_states())
    best = best_feasible_trial(study)
    return StudySummary(
        name=study.study_name, storage=storage, finished=count_finished(study),  # as --budget counts them
        feasible=sum(1 for t in trials if is_feasible(t) and counts_toward_budget(t) and not is_copy(t)),  # of those
        best_value=None if best is None else best.value,
        best_trial=None if best is None else best.number, objective=StudyRecord.from_study(study).objective,
    )


def list_studies(storage: str | None = None) -> list[StudySummary]:
    """Every study in ``studies/*.db`` (or in ``storage``)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    urls = [storage] if storage else [f"sqlite:///{p}" for p in sorted(STUDIES_DIR.glob("*.db"))]
    out = []
    for url in urls:
        store = optuna_storage(url, "")  # the driver that is installed (tuner.workers.driver_url)
        for name in own_studies(optuna.get_all_study_names(store)):
            out.append(summarize(optuna.load_study(study_name=name, storage=store), url))
    return out


def is_feasible(trial: FrozenTrial) -> bool:
    from optuna.trial import TrialState

    return trial.state == TrialState.COMPLETE and bool(TrialRecord.from_trial(trial).feasible)


def best_feasible_trial(study: optuna.Study) -> FrozenTrial | None:
    """The study's recommendation: the winner of its confirmation (:func:`confirmation`)
    when one was made on the trials it now holds (None when no candidate held the target
    on every repeat), else the feasible trial with the most
    throughput (ties: the earlier trial; confirmation repeats left out)."""
    trials = study.get_trials(deepcopy=False)
    conf = confirmation(study)
    if conf is not None and not conf.held:
        return None  # no candidate met the target on every repeat: none is recommended
    if conf is not None:
        by_number = {t.number: t for t in trials}
        if conf.winner in by_number and is_feasible(by_number[conf.winner]):
            return by_number[conf.winner]
    feasible = [t for t in trials if is_feasible(t) and not is_confirmation(t)]
    return max(feasible, key=lambda t: (t.value, -t.number), default=None)


def confirmation(study: optuna.Study) -> Any:
    """The study's :class:`~tuner.confirmation.Confirmation`, or None when it has none or
    trials finished after it was made (it no longer covers them)."""
    from tuner.confirmation import Confirmation

    data = StudyRecord.from_study(study).confirmation
    if not data or int(data.get("finished", -1)) != count_finished(study):
        return None
    try:
        return Confirmation.from_dict(data)
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Recommendation:
    """What a study recommends, as every reader tells it (``tuner search`` and ``tuner studies
    show``, the report, the notebook, :func:`tuner.analysis.recommendation`): the trial
    (:func:`best_feasible_trial`), what that trial measured, and the confirmation that chose it
    (None when none did: ``--confirm 0``, or trials finished after it)."""

    trial: int
    value: float                 #: the trial's own measurement (the objective's unit)
    confirmation: Any = None     #: tuner.confirmation.Confirmation whose winner is ``trial``

    @property
    def confirmed(self) -> bool:
        return self.confirmation is not None

    @property
    def mean(self) -> float:
        """The figure to plan with: the confirmed mean over the repeats, else the one measurement."""
        return float(self.confirmation.mean) if self.confirmed else self.value

    @property
    def measurements(self) -> int:
        return len(self.confirmation.measurements.get(self.trial, [])) if self.confirmed else 1

    def to_dict(self) -> dict[str, Any]:
        conf = self.confirmation
        return {"trial": self.trial, "value": self.value, "mean": self.mean, "measurements": self.measurements,
                "band": None if conf is None else list(conf.band), "reason": None if conf is None else conf.reason}


def recommendation(study: optuna.Study) -> Recommendation | None:
    """The study's :class:`Recommendation`, or None when it recommends nothing (no trial met the
    target, or none held it on every repeat)."""
    best = best_feasible_trial(study)
    if best is None:
        return None
    conf = confirmation(study)
    return Recommendation(best.number, float(best.value or 0.0),
                          conf if conf is not None and conf.winner == best.number else None)


def top_feasible_trials(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """The ``k`` best feasible trials, one per configuration (repeats and confirmation
    measurements left out)."""
    feasible = [t for t in study.get_trials(deepcopy=False)
                if is_feasible(t) and not TrialRecord.from_trial(t).is_repeat and not is_confirmation(t)]
    return sorted(feasible, key=lambda t: (-t.value, t.number))[:k]


def closest_miss(study: optuna.Study) -> FrozenTrial | None:
    """The trial that missed the target by the least: smallest P95 TTFT overshoot among
    the trials that latency failed; else the first one that errors failed (too many
    requests failed); else the first config the planner rejected."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if not is_feasible(t)]
    records = {t.number: TrialRecord.from_trial(t) for t in done}
    measured = [t for t in done if records[t.number].p95_ttft_at_lowest_load_s is not None
                and records[t.number].failed_by != "errors"]
    if measured:
        return min(measured, key=lambda t: (records[t.number].p95_ttft_at_lowest_load_s, t.number))
    by_errors = [t for t in done if records[t.number].failed_by == "errors"]
    if by_errors:
        return by_errors[0]
    return done[0] if done else None


def error_totals(study: optuna.Study) -> dict[str, int]:
    """Failed requests per error kind over every load point of every trial that ran
    (repeats of an earlier trial counted once), most first."""
    from optuna.trial import TrialState

    totals: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        rec = TrialRecord.from_trial(t)
        if rec.is_repeat:
            continue
        for point in rec.loads:
            for kind, n in point.errors.items():
                totals[str(kind)] = totals.get(str(kind), 0) + int(n)
    return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))


def gpu_time(study: optuna.Study) -> dict[str, float]:
    """Seconds the study's servers held the deployment's GPUs: ``start_s`` (starting them,
    refused starts included: that is a configuration's answer), ``replay_s`` (the measured
    loads), ``wasted_s`` (trials that measured nothing: interrupted, environment faults,
    crashes), ``wasted_trials`` and ``total_s``. Copies of a measurement cost nothing."""
    from optuna.trial import TrialState

    out = {"start_s": 0.0, "replay_s": 0.0, "wasted_s": 0.0, "wasted_trials": 0.0}
    for t in study.get_trials(deepcopy=False):
        rec = TrialRecord.from_trial(t)
        if rec.repeat_of is not None:
            continue
        if t.state == TrialState.FAIL:
            if rec.gpu_s:
                out["wasted_s"] += float(rec.gpu_s)
                out["wasted_trials"] += 1
            continue
        replay = sum(float(p.duration_s or 0.0) for p in rec.loads)
        out["replay_s"] += replay
        out["start_s"] += max(0.0, float(rec.gpu_s or 0.0) - replay) if rec.gpu_s else float(rec.run.startup_s or 0.0)
    out["total_s"] = out["start_s"] + out["replay_s"] + out["wasted_s"]
    return out


def miss_explanation(trial: FrozenTrial) -> str:
    """One line: why this trial was infeasible, and by how much it missed (for one that
    errors failed: how many requests failed, of which kinds)."""
    from tuner.urls import redact

    rec = TrialRecord.from_trial(trial)
    target = rec.target_ttft_s
    p95 = rec.p95_ttft_at_lowest_load_s
    if rec.failed_by == "errors":
        return f"trial {trial.number}: {redact(str(rec.infeasible_reason))}"
    if p95 is not None and target:
        load = rec.lowest_load or "the lowest load"
        return (
            f"trial {trial.number} came closest: P95 TTFT {p95:.3g} s at {load} vs the {target:.3g} s "
            f"target ({p95 - target:+.3g} s, {p95 / target - 1:+.0%})"
        )
    return f"trial {trial.number}: {redact(rec.infeasible_reason or 'no measurement')}"


def trial_config(trial: FrozenTrial) -> ServeConfig:
    """The :class:`ServeConfig` a trial ran."""
    config = TrialRecord.from_trial(trial).config
    if config is None:
        raise InputError(f"trial {trial.number} stores no config (not written by tuner search?)")
    return config

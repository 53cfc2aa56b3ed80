"""What a study stores, typed: :class:`TrialRecord` (one trial's ``user_attrs``) and
:class:`StudyRecord` (the study's stamp), each with a schema version.

The search is the one writer (:func:`write` turns a record into ``set_user_attr`` calls,
:meth:`TrialRecord.to_attrs` gives the attrs of a trial created whole); every reader
goes through :meth:`TrialRecord.from_trial` and :meth:`StudyRecord.from_study`, so a
renamed key is one edit here and a migration, never a silent ``None`` somewhere else.

Versions: 1 is tuner 0.1.0's trials (no ``schema_version`` attr; the oldest of them kept
the memory plan, vLLM version, log paths and startup time beside ``run``, not in it);
2 adds ``schema_version``. :func:`migrate` reads either. The study's stamp has its own
version (:data:`STUDY_SCHEMA_VERSION`): 3 adds ``objective``, which a study of version 1 or
2 had only in its name (``....goodput``: :func:`migrate_study`). The attrs stay plain JSON under
the same names, so Optuna's own tools (``optuna-dashboard``) read them as before.

A study's trials are its configurations: the repeats that confirm its winner live in a companion
study in the same storage (:attr:`StudyRecord.confirmation_study`, ``<name>.confirm``), and the
recommendation they made is the study's ``confirmation`` attr (:attr:`StudyRecord.confirmation`).
A study written before that holds its repeats among its trials (``confirm_of`` set): they are read
as repeats (:attr:`TrialRecord.is_confirmation`), never as configurations (``tuner.study.repeats``).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.core.jsonsafe import json_safe
from tuner.core.memo import once_per_object
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.slo import OBJECTIVES

if TYPE_CHECKING:
    import optuna

SCHEMA_VERSION = 2
#: Version of :class:`StudyRecord` (1 and 2 as the trials'; 3 stamps the objective).
STUDY_SCHEMA_VERSION = 3
#: ``fail_kind`` of a trial that measured nothing about its configuration (:mod:`tuner.study.recovery`).
NOT_MEASURED = ("interrupted", "environment")


@functools.cache
def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _known(cls: type, data: Mapping[str, Any] | None) -> dict[str, Any]:
    names = _fields(cls)
    return {k: v for k, v in (data or {}).items() if k in names}


def _set(record: Any) -> dict[str, Any]:
    """The fields of ``record`` that differ from their defaults."""
    out = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if value != default:
            out[f.name] = value
    return out


@dataclass(frozen=True, slots=True)
class LoadRecord:
    """One load point of a trial's goodput search."""

    load: str | None = None
    level: float | None = None
    p95_ttft_s: float | None = None
    tokens_per_s: float | None = None
    error_rate: float | None = None
    errors: Mapping[str, int] = field(default_factory=dict)
    duration_s: float | None = None
    stopped_early: bool = False
    passed: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> LoadRecord:
        return cls(**_known(cls, data))

    def to_dict(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))


@dataclass(frozen=True, slots=True)
class Edge:
    """Where a feasible trial's edge lies: the most load meeting the target (``level``),
    the next failing one, and whether they came within the tolerance (``located``)."""

    level: float | None = None
    failing_level: float | None = None
    located: bool = False
    tolerance: float | None = None
    cap: int | None = None
    beyond_cap: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Edge | None:
        return None if not data else cls(**_known(cls, data))

    def to_dict(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))


#: What a start reports of itself (the rest of :class:`RunFacts` is the study's).
START = ("vllm_version", "log_paths", "startup_s", "plan")


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What a trial ran on (reproducibility): the workload, backend, hardware, seeds,
    sampler, and what the start reported (vLLM version, logs, startup seconds, the
    memory planner's ``plan``)."""

    workload_fingerprint: str | None = None
    workload_source: str | None = None
    workload_file: str | None = None
    workload_requests: int | None = None
    workload_longest_tokens: int | None = None
    workload_shares_prefixes: bool | None = None
    backend: str | None = None
    restarts: bool | None = None    #: the backend's capabilities (tuner.search.backend): what folding
    simulated: bool | None = None   #: and the noise prior go by; None in a study recorded before them
    hardware: Deployment | None = None
    seed: int | None = None
    load_seed: int | None = None
    sample: str | None = None
    sampler: str | None = None
    space: str | None = None
    load_kind: str | None = None
    vllm_version: str | None = None
    log_paths: tuple[str, ...] = ()
    startup_s: float | None = None
    plan: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RunFacts:
        kw = _known(cls, data)
        if kw.get("hardware") is not None:
            kw["hardware"] = Deployment.from_dict(kw["hardware"])
        kw["log_paths"] = tuple(kw.get("log_paths") or ())
        kw["plan"] = dict(kw.get("plan") or {})
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        out = _set(self)
        if self.hardware is not None:
            out["hardware"] = self.hardware.to_dict()
        return json_safe(out)

    def replace(self, **changes: Any) -> RunFacts:
        return dataclasses.replace(self, **changes)

    def with_start(self, start: RunFacts) -> RunFacts:
        """These facts with those a start reported in ``start`` (:data:`START`) where set."""
        return self.replace(**{k: v for k, v in _set(start).items() if k in START})


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """One trial as the search stored it (see :mod:`tuner.search` for what each field
    means); a field at its default was not written. ``feasible`` is ``None`` for a trial
    not judged (failed, pruned, waiting); ``errors`` ``None`` for one never measured.
    ``tags`` are the keys a run stamped on its trials (``run_search(tags=...)``, e.g.
    nightly's ``night``)."""

    schema_version: int = SCHEMA_VERSION
    config: ServeConfig | None = None
    target_ttft_s: float | None = None
    slos: tuple[str, ...] = ()
    feasible: bool | None = None
    constraint: float | None = None
    constraints: Mapping[str, float] = field(default_factory=dict)
    binding_slo: str | None = None
    goodput_requests_per_s: float | None = None
    tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None
    error_rate: float | None = None
    summary: Mapping[str, Any] = field(default_factory=dict)
    server: Mapping[str, Any] = field(default_factory=dict)
    loads: tuple[LoadRecord, ...] = ()
    chosen_load: str | None = None
    lowest_load: str | None = None
    p95_ttft_at_lowest_load_s: float | None = None
    edge: Edge | None = None
    errors: Mapping[str, int] | None = None
    error_detail: Mapping[str, str] = field(default_factory=dict)
    failed_by: str | None = None
    infeasible_reason: str | None = None
    rejected_kind: str | None = None
    rejected_at: str | None = None
    gpu_s: float | None = None
    run: RunFacts = field(default_factory=RunFacts)
    prediction: Mapping[str, Any] | None = None
    pruned_reason: str | None = None
    twin_of: int | None = None
    repeat_of: int | None = None
    confirm_of: int | None = None
    confirm_round: int | None = None
    #: A pass within the noise of a start (tuner.search.boundary): its lowest load's P95 TTFT,
    #: the pessimistic estimate and the constraint the sampler was given.
    boundary: Mapping[str, float] | None = None
    #: A verdict near the target measured on a second start (tuner.search.verdict): each start's.
    verdict: Mapping[str, Any] | None = None
    warm_start: bool = False
    vllm_defaults: bool = False
    proposed_by: str | None = None
    retry_of: int | None = None
    rerun_of_night: str | None = None
    fail_kind: str | None = None
    fail_reason: str | None = None
    #: How a failed start or disrupted measurement was judged (tuner.search.blame.Referee).
    blame: Mapping[str, Any] | None = None
    error: str | None = None
    worker: str | None = None
    host: str | None = None
    pid: int | None = None
    gpus: str | None = None
    tags: Mapping[str, Any] = field(default_factory=dict)

    # -- reading ----------------------------------------------------------------------------
    @classmethod
    def from_trial(cls, trial: Any) -> TrialRecord:
        """The record of an Optuna trial (frozen or running), of any schema version; a finished
        trial's is read once per trial object (:func:`tuner.core.memo.once_per_object`)."""
        read = functools.partial(cls.from_attrs, trial.user_attrs, trial=getattr(trial, "number", None))
        state = getattr(trial, "state", None)
        return once_per_object(trial, read) if state is not None and state.is_finished() else read()

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], *, trial: int | None = None) -> TrialRecord:
        data = migrate(attrs)
        names = _fields(cls)
        kw = {k: v for k, v in data.items() if k in names and k != "tags"}
        kw["tags"] = {k: v for k, v in data.items() if k not in names}
        try:
            if kw.get("config") is not None:
                kw["config"] = ServeConfig.from_dict(dict(kw["config"]))
            kw["run"] = RunFacts.from_dict(kw.get("run"))
            kw["edge"] = Edge.from_dict(kw.get("edge"))
            kw["loads"] = tuple(LoadRecord.from_dict(p) for p in kw.get("loads") or ())
            kw["slos"] = tuple(kw.get("slos") or ())
            for name in ("summary", "server", "error_detail", "constraints"):
                kw[name] = dict(kw.get(name) or {})
            if kw.get("errors") is not None:
                kw["errors"] = dict(kw["errors"])
            return cls(**kw)
        except (InputError, TypeError, ValueError) as err:
            who = "a trial" if trial is None else f"trial {trial}"
            raise InputError(f"{who} holds attrs tuner cannot read: {err}",
                             hint="was the study written by tuner search?") from err

    # -- writing ----------------------------------------------------------------------------
    def to_attrs(self) -> dict[str, Any]:
        """The trial's ``user_attrs``: every field set, as JSON, under its own name."""
        out: dict[str, Any] = {"schema_version": self.schema_version}
        for name, value in _set(self).items():
            if name == "tags":
                out.update(value)
            elif name in ("config", "run", "edge"):
                out[name] = value.to_dict()
            elif name == "loads":
                out[name] = [p.to_dict() for p in value]
            else:
                out[name] = value
        return json_safe(out)

    def replace(self, **changes: Any) -> TrialRecord:
        return dataclasses.replace(self, **changes)

    # -- what readers ask ---------------------------------------------------------------------
    @property
    def is_repeat(self) -> bool:
        """The result was copied from an earlier trial of the same configuration."""
        return self.repeat_of is not None

    @property
    def is_confirmation(self) -> bool:
        """A repeat measurement made to confirm the study's winner (outside the budget)."""
        return self.confirm_of is not None

    @property
    def measured_nothing(self) -> bool:
        """A failure that says nothing about the configuration (:mod:`tuner.study.recovery`)."""
        return self.fail_kind in NOT_MEASURED


#: Fields a trial carries from the queue or its worker, not from its measurement.
QUEUED = ("warm_start", "vllm_defaults", "proposed_by", "retry_of", "rerun_of_night",
          "worker", "host", "pid", "gpus")


def migrate(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Trial attrs of any schema version as version :data:`SCHEMA_VERSION` attrs."""
    data = dict(attrs)
    version = int(data.get("schema_version", 1))
    if version > SCHEMA_VERSION:
        raise InputError(f"a trial was written by a newer tuner (record version {version}, this one reads "
                         f"{SCHEMA_VERSION})", hint="upgrade tuner to read this study")
    if version == 1:
        moved = {k: data.pop(k) for k in ("plan", "vllm_version", "log_paths", "startup_s") if k in data}
        if moved:  # the oldest trials kept the start's facts beside ``run``
            data["run"] = {**moved, **(data.get("run") or {})}
    data["schema_version"] = SCHEMA_VERSION
    return data


def write(set_attr: Callable[[str, Any], None], record: TrialRecord | StudyRecord) -> None:
    """Store the fields of ``record`` that are set through ``set_attr(key, value)``
    (``trial.set_user_attr``, a storage's ``set_trial_user_attr`` bound to a trial, or
    ``study.set_user_attr``)."""
    for key, value in record.to_attrs().items():
        set_attr(key, value)


def write_confirmation(set_attr: Callable[[str, Any], None], confirmation: Mapping[str, Any] | None = None,
                       companion: str | None = None) -> None:
    """Store the study's recommendation (``confirmation``) and the name of the companion study
    that holds its repeats (``companion``), those given, through ``set_attr``
    (``study.set_user_attr``); the study's stamp is left as written."""
    if companion is not None:
        set_attr("confirmation_study", companion)
    if confirmation is not None:
        set_attr("confirmation", json_safe(dict(confirmation)))


def migrate_study(attrs: Mapping[str, Any], name: str = "") -> dict[str, Any]:
    """A study's attrs of any stamp version as version :data:`STUDY_SCHEMA_VERSION`'s
    (``schema_version`` kept as written). Before version 3 a goodput study was told apart
    only by its name, which ``tuner search`` ended in ``.goodput``."""
    data = dict(attrs)
    version = int(data.get("schema_version", 1))
    if version > STUDY_SCHEMA_VERSION:
        raise InputError(f"study {name!r} was written by a newer tuner (study record version {version}, this one "
                         f"reads {STUDY_SCHEMA_VERSION})", hint="upgrade tuner to read this study")
    if version < 3 and data.get("space") and "objective" not in data:
        data["objective"] = "goodput" if name.endswith(".goodput") else "tokens"
    data["schema_version"] = version
    return data


@dataclass(frozen=True, slots=True)
class StudyRecord:
    """What ``tuner search`` stamps on a study when it creates it: what it was searched
    for (``target_ttft_s`` and the other ``slos``, the ``objective`` its values score, a
    key of :data:`tuner.serving.slo.OBJECTIVES`) and on what. ``objective`` is ``None`` for a study
    never stamped (one made outside ``tuner search``)."""

    schema_version: int = STUDY_SCHEMA_VERSION
    space: str | None = None
    space_path: str | None = None
    deployment: Deployment | None = None
    workload_fingerprint: str | None = None
    backend: str | None = None
    sampler: str | None = None
    seed: int | None = None
    target_ttft_s: float | None = None
    load_kind: str | None = None
    slos: tuple[str, ...] = ()
    objective: str | None = None
    #: :meth:`tuner.space.SearchSpace.fingerprint` and ``content`` (None in a study stamped before them)
    space_fingerprint: str | None = None
    space_content: dict[str, Any] | None = None
    #: The recommendation of the confirmation (:meth:`tuner.study.race.Confirmation.to_dict`, and
    #: ``finished``: the budget's trials it covers), written by :func:`write_confirmation`.
    confirmation: Mapping[str, Any] | None = None
    #: The companion study holding the confirmation's repeats (None: the study has none, or holds
    #: them among its own trials, as before tuner kept them apart).
    confirmation_study: str | None = None

    def __post_init__(self) -> None:
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise InputError(f"a study's objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")

    @classmethod
    def from_study(cls, study: optuna.Study) -> StudyRecord:
        kw = _known(cls, migrate_study(study.user_attrs, study.study_name))
        kw["slos"] = tuple(kw.get("slos") or ())
        if kw.get("deployment"):
            kw["deployment"] = Deployment.from_dict(kw["deployment"])
        else:
            kw["deployment"] = None
        return cls(**kw)

    def to_attrs(self) -> dict[str, Any]:
        out = {k: v for k, v in _set(self).items()}
        out["schema_version"] = self.schema_version
        if self.deployment is not None:
            out["deployment"] = self.deployment.to_dict()
        return json_safe(out)


__all__ = ["NOT_MEASURED", "QUEUED", "SCHEMA_VERSION", "STUDY_SCHEMA_VERSION", "Edge", "LoadRecord", "RunFacts",
           "StudyRecord", "TrialRecord", "migrate", "migrate_study", "write", "write_confirmation"]

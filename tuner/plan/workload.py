"""Which requests a plan replays, and how they stand to the study's (its requests are
checked by fingerprint; :class:`~tuner.serving.capacity.ReplayedWorkload` records the answer).

Plan replays the requests the study searched on: the file it read (``workload_file`` of
the trial's run; never a log path recorded inside a converted file), or its synthetic mix
with more requests (:data:`PLAN_REQUESTS`, a larger sample of the same distribution). A
workload plan picked itself that is not the study's is refused (InputError); one given on
purpose (``workload=``, ``--trace``) is replayed with a warning.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.core.errors import InputError
from tuner.search import build_workload
from tuner.space import LOAD_KINDS, load_space
from tuner.study import own_studies
from tuner.study.locks import driver_url  # postgresql:// with the driver that is installed
from tuner.study.record import StudyRecord, TrialRecord
from tuner.study.storage import STUDIES_DIR
from tuner.traffic import load_trace
from tuner.traffic.synth import default_workload

if TYPE_CHECKING:
    import optuna

    from tuner.space import WorkloadSpec
    from tuner.traffic.workload import Workload

#: Requests in the built-in mix for a plan (a study's own count when larger).
PLAN_REQUESTS = 1000


# -- where the configuration comes from ---------------------------------------------------
def find_newest_study(folder: Path | str = STUDIES_DIR, storage: str | None = None) -> tuple[str, str | None]:
    """``(name, storage)`` of the newest study: the last one created in the most recently
    written ``studies/*.db`` (storage ``None`` when the file is ``studies/<name>.db``,
    the default), or the last created in ``storage``. InputError when there is none."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage is not None:
        names = own_studies(optuna.get_all_study_names(driver_url(storage)))
        if not names:
            raise InputError(f"no study in {storage}", hint="run tuner search first, or give --study")
        return names[-1], storage
    for db in sorted(Path(folder).glob("*.db"), key=lambda p: p.stat().st_mtime, reverse=True):
        url = f"sqlite:///{db}"
        names = own_studies(optuna.get_all_study_names(url))
        if names:
            name = names[-1]
            return name, None if db == Path(folder) / f"{name}.db" else url
    raise InputError(f"no study in {folder}/",
                     hint="run tuner search first, give --study/--storage, or a config with --gpu/--model/--tensor-parallel-size ...")  # noqa: E501


def newest_study(folder: Path | str = STUDIES_DIR, storage: str | None = None) -> str:
    """Name of the newest study (see :func:`find_newest_study`, which also gives its storage)."""
    return find_newest_study(folder, storage)[0]


#: What to do when plan cannot replay the study's own requests.
FIX = "give --trace FILE to plan on another workload on purpose"


@dataclass(frozen=True, slots=True)
class Studied:
    """What a trial says of the workload its study searched on (its record's ``run``,
    written by :func:`tuner.search.run_search`; the study's stamp for the fingerprint of
    trials that predate it). ``file`` is absent in studies made before it was recorded."""

    study: str
    fingerprint: str | None = None
    requests: int | None = None
    file: str | None = None
    source: str | None = None
    load_kind: str | None = None

    @classmethod
    def of(cls, study: optuna.Study, trial: Any) -> Studied:
        run, stamp = TrialRecord.from_trial(trial).run, StudyRecord.from_study(study)
        requests = run.workload_requests
        return cls(study=study.study_name, fingerprint=run.workload_fingerprint or stamp.workload_fingerprint,
                   requests=int(requests) if isinstance(requests, int) else None,
                   file=run.workload_file or None, source=run.workload_source or None,
                   load_kind=run.load_kind or stamp.load_kind)

    def described(self) -> str:
        count = "?" if self.requests is None else f"{self.requests:,}"
        return f"{count} requests (fingerprint {self.fingerprint})"


@dataclass(frozen=True, slots=True)
class Chosen:
    """The workload plan replays: ``base`` (the first repeat), ``build(seed)`` for another
    sample of a synthetic mix (``None``: repeats replay 90% of ``base``'s rows),
    ``sized(seed, n)`` for ``n`` requests of that mix (``None`` for a file's rows: it
    cannot grow), the file read, how it stands to the study's
    (:data:`tuner.serving.capacity.MATCHES`) and what to say."""

    base: Workload
    build: Callable[[int], Workload] | None = None
    sized: Callable[[int, int], Workload] | None = None
    file: str | None = None
    match: str = "unchecked"
    notes: tuple[str, ...] = ()


def _refuse(studied: Studied, replays: Workload, why: str = "") -> InputError:
    return InputError(f"study {studied.study!r} was searched on {studied.described()}, but plan would replay "
                      f"{len(replays):,} requests of {replays.source} (fingerprint {replays.fingerprint()})"
                      f"{why}", hint=FIX)


def _study_spec(study: optuna.Study, studied: Studied) -> tuple[WorkloadSpec | None, str | None]:
    """The study's search space's workload section with the load kind the study ran
    (``tuner search --load`` changes it), and the space's name or path; ``None`` when
    the space cannot be read."""

    stamp = StudyRecord.from_study(study)
    path = stamp.space_path or stamp.space
    if not path:
        return None, None
    try:
        spec = load_space(path).workload
    except InputError:
        return None, str(path)
    if studied.load_kind in LOAD_KINDS and studied.load_kind != spec.load:
        spec = dataclasses.replace(spec, load=studied.load_kind)
    return spec, str(path)


def _from_file(studied: Studied, candidates: Sequence[str], num_requests: int | None) -> Chosen:
    """The study's file: the first candidate whose rows (all, or the first
    ``num_requests``) are the study's requests; InputError naming both fingerprints when
    none is."""

    first = load_trace(candidates[0])
    for path in candidates:
        whole = first if path == candidates[0] else load_trace(path)
        n = len(whole) if not num_requests else min(num_requests, len(whole))
        part = whole if n == len(whole) else whole.take(slice(0, n))
        notes: list[str] = []
        if num_requests and num_requests > len(whole):
            notes.append(f"--num-requests {num_requests:,} is more than the {len(whole):,} requests of {path}: "
                         "all of them replayed")
        if studied.fingerprint is None:
            notes.append(f"the study recorded no workload fingerprint: plan replays {len(part):,} requests of "
                         f"{path} without checking that they are the study's")
            return Chosen(part, file=str(Path(path).resolve()), match="unchecked", notes=tuple(notes))
        if part.fingerprint() == studied.fingerprint:
            return Chosen(part, file=str(Path(path).resolve()), match="same", notes=tuple(notes))
        if part is not whole and whole.fingerprint() == studied.fingerprint:
            notes.append(f"plan replays the first {n:,} of the study's {len(whole):,} requests of {path} "
                         f"(--num-requests; fingerprint {part.fingerprint()}, the study's {studied.fingerprint}): "
                         "a subset, on purpose")
            return Chosen(part, file=str(Path(path).resolve()), match="first-rows", notes=tuple(notes))
    raise _refuse(studied, first)


def study_workload(study: optuna.Study, trial: Any, num_requests: int | None, seed: int = 0) -> Chosen:
    """The study's workload, checked against the trial's fingerprint.

    The file the study read (``workload_file``, never a path recorded inside a converted
    file); for older studies its ``workload_source`` or the space's ``trace`` when that is
    a file here (the first one whose requests are the study's); the first
    ``num_requests`` rows when given. Else the search space's synthetic mix, rebuilt and
    checked as the study searched on it, then sampled with ``num_requests`` (default at
    least :data:`PLAN_REQUESTS`) requests at the study's seed + ``seed``: a deliberate
    other sample of the same distribution, and the notes say so. InputError (plan would
    replay other requests than the study's) names both fingerprints and ``--trace``."""

    studied = Studied.of(study, trial)
    spec, space = _study_spec(study, studied)
    if studied.file:
        if not Path(studied.file).is_file():
            raise InputError(f"study {studied.study!r} was searched on {studied.file}, which is not there any more",
                             hint=FIX)
        return _from_file(studied, [studied.file], num_requests)
    candidates = [p for p in (studied.source, spec.trace if spec else None) if p and Path(p).is_file()]
    if candidates:
        return _from_file(studied, list(dict.fromkeys(candidates)), num_requests)
    if spec is None or spec.trace:
        n = num_requests or PLAN_REQUESTS
        base = default_workload(seed=seed, n=n)
        if studied.fingerprint is None:
            return Chosen(base, lambda s: default_workload(seed=s, n=n), lambda s, k: default_workload(seed=s, n=k), notes=(  # noqa: E501
                f"plan replays the built-in mix ({n:,} requests): the study's workload cannot be rebuilt and "
                "recorded no fingerprint to check",))
        why = (f": the study's file {spec.trace} is not here" if spec and spec.trace
               else f": its search space {space} cannot be read" if space else ": it recorded no search space")
        raise _refuse(studied, base, why)
    if studied.fingerprint is not None:
        searched = build_workload(spec)
        if searched.fingerprint() != studied.fingerprint:
            raise InputError(f"study {studied.study!r} was searched on {studied.described()}, but its search space "
                             f"{space} now builds {len(searched):,} requests (fingerprint {searched.fingerprint()})",
                             hint=FIX)
    n = num_requests or max(spec.requests, PLAN_REQUESTS)

    def sized(s: int, k: int) -> Workload:
        return build_workload(dataclasses.replace(spec, requests=k, seed=spec.seed + s))

    def build(s: int) -> Workload:
        return sized(s, n)

    base = build(seed)
    if base.fingerprint() == studied.fingerprint:
        return Chosen(base, build, sized, match="same")
    size = "a larger" if n > spec.requests else "a smaller" if n < spec.requests else "another"
    said = (f"plan replays {n:,} requests of the study's synthetic mix (seed {spec.seed + seed}, fingerprint "
            f"{base.fingerprint()}): {size} sample of the distribution the study searched on {spec.requests:,} "
            f"requests (seed {spec.seed}")
    if studied.fingerprint is None:
        return Chosen(base, build, sized, notes=(said + "; the study recorded no fingerprint to check)",))
    return Chosen(base, build, sized, match="same-mix", notes=(said + f", fingerprint {studied.fingerprint})",))


def given(workload: Workload, studied: Studied | None, warn: Callable[[str], None]) -> Chosen:
    """A workload given on purpose (``--trace``): replayed as it is, with a warning when
    it is not the study's."""
    file = str(Path(workload.source).resolve()) if Path(workload.source).is_file() else None
    if studied is None or studied.fingerprint is None:
        return Chosen(workload, file=file)
    if workload.fingerprint() == studied.fingerprint:
        return Chosen(workload, file=file, match="same")
    text = (f"study {studied.study!r} was searched on {studied.described()}; plan replays {len(workload):,} "
            f"requests of {workload.source} (fingerprint {workload.fingerprint()}), as given with --trace")
    warn(text)
    return Chosen(workload, file=file, match="other", notes=(text,))


def resample(workload: Workload, seed: int, share: float = 0.9) -> Workload:
    """Another sample of a given workload for a repeat: ``share`` of its rows, in order."""
    rng = np.random.default_rng(seed)
    n = len(workload)
    keep = np.sort(rng.choice(n, size=max(1, int(round(share * n))), replace=False))
    return workload.take(keep)


__all__ = ["FIX", "PLAN_REQUESTS", "Chosen", "Studied", "find_newest_study", "given", "newest_study", "resample",
           "study_workload"]

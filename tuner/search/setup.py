"""A run's set-up (:class:`StudySetup`, mixed into :class:`~tuner.search.driver.SearchRun`): its
predictor, the study opened and checked against what it was made for, the first trials queued."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.search.constraints import named_constraints
from tuner.search.defaults import default_trials
from tuner.search.objective import OBJECTIVE_UNITS
from tuner.search.records import report_stale_servers, stamp_study
from tuner.search.samplers import make_sampler
from tuner.serving.config import ServeConfig
from tuner.study import count_finished, open_study
from tuner.study.record import StudyRecord, TrialRecord

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

    from tuner.search.prediction import Predictor


class StudySetup:
    """The set-up steps of :class:`~tuner.search.driver.SearchRun` (its ``__init__`` calls them)."""

    def _predictor(self, predictor: Predictor | str | None) -> Predictor | None:
        if predictor == "auto":
            from tuner.search.prediction import sim_predictor

            s = self.settings
            # worth predicting: a server started with the configuration, whose trials cost GPU time
            if self.backend.restarts and self.backend.measures_gpu_time and s.precheck and s.early_stop:
                return sim_predictor(self.deployment, self.workload, self.slos, self.space.workload.load)
            return None
        if isinstance(predictor, str):
            raise InputError(f"unknown predictor {predictor!r}", hint="use 'auto', or none")
        return predictor

    def _open(self) -> optuna.Study:
        from tuner.study.workers import worker_seed

        s = self.settings
        st = open_study(self.name, self.storage)
        stored = stored_distributions(st)
        self.space = self.space.encoded_for(stored)  # a study written with <knob>_index keeps it
        st.sampler = make_sampler(s.sampler, seed=worker_seed(s.seed, self.storage), space=self.space)
        self.named_constraints = named_constraints(st)  # likewise constraints by name
        stamp_study(st, self.space, self.deployment, self.fingerprint, self.backend.name, s.sampler, s.seed,
                     self.target, s.objective)
        record = StudyRecord.from_study(st)
        if record.objective not in (None, s.objective):
            raise InputError(
                f"study {self.name!r} scores {record.objective} ({OBJECTIVE_UNITS[record.objective]}), not "
                f"{s.objective}: its trials' values would mix two units",
                hint=f"resume it with --objective {record.objective}, or give --study a new name")
        if record.slos != self.slos.texts[1:]:
            raise InputError(
                f"study {self.name!r} was searched for {', '.join(record.slos) or 'P95 TTFT alone'}, not "
                f"{', '.join(self.slos.texts[1:]) or 'P95 TTFT alone'}: its trials' feasibility would mix two SLO sets",
                hint="resume it with the same --slo options, or give --study a new name",
            )
        self._check_space(record)
        self._check_distributions(stored)
        stamped = record.target_ttft_s
        if stamped is not None and abs(float(stamped) - self.target) > 1e-9:
            raise InputError(
                f"study {self.name!r} was searched for P95 TTFT <= {float(stamped):g} s, not {self.target:g} s: "
                "its trials' feasibility would mix two targets",
                hint=f"resume it with --target-ttft {float(stamped):g}s, or give --study a new name",
            )
        report_stale_servers(self.obs, s.kill_stale)
        self.obs.on_start(self.name, count_finished(st), s.budget)
        return st

    def _check_space(self, record: StudyRecord) -> None:
        """The space is part of the study's identity: the same name with another space is
        refused (its best trial may lie outside the new space), unless ``resume_anyway``."""
        from tuner.space import space_difference

        if record.space_fingerprint in (None, self.space.fingerprint()):
            return
        what = space_difference(record.space_content or {}, self.space.content())
        if not self.settings.resume_anyway:
            raise InputError(f"study {self.name!r} was searched over another space ({what})",
                             hint="give --study a new name for the new space, or --resume-anyway to add its "
                                  "trials to the old ones")
        self.obs.on_warning(f"resuming study {self.name!r} over another space than it was made with ({what})")

    def _check_distributions(self, stored: dict[str, BaseDistribution]) -> None:
        """Optuna keeps one distribution per parameter in a study: a space resumed with
        ``--resume-anyway`` whose choices of a knob changed is refused here, in one line."""
        from optuna.distributions import CategoricalDistribution, check_distribution_compatibility

        now = {p.key: p.distribution() for p in self.space.params}
        if len(self.space.layout_choices) > 1:
            now["layout"] = CategoricalDistribution(list(self.space.layout_choices))
        for key, dist in now.items():
            try:
                if key in stored:
                    check_distribution_compatibility(stored[key], dist)
            except ValueError as err:
                raise InputError(
                    f"study {self.name!r} holds {key} as {_shown(stored[key])}, the space as {_shown(dist)}: "
                    "Optuna cannot change a parameter's choices within a study",
                    hint="give --study a new name for the new space") from err

    def _enqueue(self, enqueue: Sequence[ServeConfig]) -> None:
        """Warm-start configurations, and vLLM's defaults per layout for a new TPE/GP study."""
        trials = self.study.get_trials(deepcopy=False)
        waiting = {tuple(sorted(t.params.items())) for t in trials}
        first = [(self.space.params_of(c), TrialRecord(warm_start=True).to_attrs()) for c in enqueue]
        if not trials and self.settings.sampler.lower() in ("tpe", "gp"):
            first += [(p, TrialRecord(vllm_defaults=True).to_attrs()) for p in default_trials(self.space)]
        for params, attrs in first:
            if tuple(sorted(params.items())) not in waiting:
                waiting.add(tuple(sorted(params.items())))
                self.study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)


def stored_distributions(study: optuna.Study) -> dict[str, BaseDistribution]:
    """Each parameter the study's trials hold, with the distribution Optuna stored for it."""
    out: dict[str, BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        out.update(trial.distributions)
    return out


def _shown(dist: BaseDistribution) -> str:
    from optuna.distributions import CategoricalDistribution

    if isinstance(dist, CategoricalDistribution):
        return f"choices {list(dist.choices)}"
    low, high, step = (getattr(dist, k, None) for k in ("low", "high", "step"))
    return f"{low}..{high}" + (f" step {step}" if step not in (None, 1) else "")

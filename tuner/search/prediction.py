"""The simulator as the search's predictor, for backends that cost GPU time.

Before a real trial starts vLLM, :class:`Predictor` runs the same goodput search on the
embedded simulator (no GPU, about a second of CPU) and returns a :class:`Prediction`:
the highest load it expects to meet the P95 TTFT target and the tokens/s there. The
search uses it twice (:mod:`tuner.search`):

* the real goodput search starts at the predicted load instead of the most the
  configuration could hold, so one passing replay and one short failing one usually
  bracket the answer;
* a configuration predicted far below the study's best is not launched at all: the trial
  is PRUNED, with the prediction stored as its evidence.

The simulator need not be right in absolute terms: :func:`correction` measures, over the
trials the study has both predicted and measured, how far reality is from the prediction
(the median ratio of measured to predicted load and tokens/s), and the search scales the
next predictions by it. A predictor that is 30% slow on every configuration costs the
first trials a step or two; after that its ranking is what matters.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.backends.sim import SimBackend
from tuner.core.errors import ConfigRejected, InputError
from tuner.search.context import TrialContext
from tuner.search.objective import evaluate
from tuner.search.settings import SearchSettings
from tuner.serving.slo import SloSet, value_text
from tuner.sim.hardware import get_gpu
from tuner.sim.model import load_model
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tuner.serving.config import Deployment, ServeConfig
    from tuner.serving.slo import SloSet
    from tuner.sim.calibration import Calibration
    from tuner.traffic.workload import Workload

#: Replays the predictor's own goodput search may take (simulated: cheap); enough to
#: bisect closed-loop users to neighbouring integers from the top.
PREDICT_REPLAYS = 8
#: Trials with both a prediction and a measurement needed before corrections are trusted.
MIN_MATCHED = 2
#: Predictions within this share of each other (same layout, same load) are the same.
TWIN_TOLERANCE = 0.005
#: A configuration whose corrected prediction is below this share of the study's best is
#: not launched.
PRUNE_SHARE = 0.8
#: A predicted twin is not launched when its twin measured below this share of the best
#: (near the best, what the simulator cannot tell apart is worth measuring); the search
#: passes the study's noise band instead once it knows it (``advise(share=...)``).
TWIN_SHARE = 0.97
#: ... and once this many predicted twins were measured, none more is launched.
TWINS_MEASURED = 2


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the simulator expects of one configuration under the study's workload."""

    feasible: bool
    level: float            # highest load predicted to meet the target (0 when none does)
    tokens_per_s: float     # at that load (0 when infeasible)
    p95_ttft_s: float | None
    reason: str = ""        # why it is infeasible, when it is
    #: The trial's Optuna constraints as the simulator's goodput search left them, one per
    #: SLO (at the predicted load; at the lowest load when infeasible): what a pruned
    #: trial gives the sampler. Empty from a predictor that does not say.
    constraints: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Correction:
    """Median ratio of measured to predicted, over ``matched`` trials (1.0 with none)."""

    level: float = 1.0
    tokens_per_s: float = 1.0
    matched: int = 0

    @property
    def trusted(self) -> bool:
        return self.matched >= MIN_MATCHED


class Predictor:
    """Predictions of the embedded simulator for one deployment, workload and target
    (a P95 TTFT bound in seconds, or the study's whole :class:`~tuner.serving.slo.SloSet`).

    ``profile`` replaces the calibration the simulator would pick for the deployment's
    GPU (the benchmarks use it to give the predictor deliberately wrong constants)."""

    def __init__(self, deployment: Deployment, workload: Workload, slo: float | SloSet, *,
                 load_kind: str = "concurrency", profile: Calibration | None = None) -> None:

        # the same goodput search as a trial's, on the simulator, with replays to spare
        self.ctx = TrialContext(SimBackend(profile=profile), deployment, workload, SloSet.of(slo), load_kind,
                                SearchSettings(max_replays=PREDICT_REPLAYS))
        self._cache: dict[str, Prediction | None] = {}

    def predict(self, config: ServeConfig) -> Prediction | None:
        """The prediction for ``config``; None when the simulator cannot model the
        deployment (an unknown GPU or model) or vLLM would refuse the configuration (the
        search's pre-check records that)."""
        import json

        key = json.dumps(config.to_dict(), sort_keys=True)
        if key not in self._cache:
            self._cache[key] = self._predict(config)
        return self._cache[key]

    def _predict(self, config: ServeConfig) -> Prediction | None:

        try:
            ev = evaluate(self.ctx, config)
        except (InputError, ConfigRejected):
            return None
        rec = ev.record
        if rec.rejected_kind:  # vLLM would refuse it: the search's pre-check records that
            return None
        p95 = rec.summary.get("ttft_p95_s")
        constraints = ev.named_constraints()
        if not ev.feasible:
            return Prediction(False, 0.0, 0.0, p95, str(rec.infeasible_reason or ""), constraints)
        level = max(p.level for p in rec.loads if p.passed)
        return Prediction(True, float(level), ev.value, p95, constraints=constraints)


def sim_predictor(deployment: Deployment, workload: Workload, slo: SloSet,
                  load_kind: str = "concurrency") -> Predictor | None:
    """A predictor for ``deployment``, or None when the simulator cannot model it (a GPU
    or model it does not know)."""

    try:
        load_model(deployment.model)
        get_gpu(deployment.gpu)
    except InputError:
        return None
    return Predictor(deployment, workload, slo, load_kind=load_kind)


def correction(trials: Iterable[FrozenTrial]) -> Correction:
    """How far measurements were from predictions, over the measured feasible trials
    that carry a feasible prediction (:attr:`TrialRecord.prediction`)."""
    levels: list[float] = []
    values: list[float] = []
    for t in trials:
        rec = TrialRecord.from_trial(t)
        pred = rec.prediction or {}
        if not (rec.feasible and pred.get("feasible")) or rec.is_repeat:
            continue
        level = _chosen_level(rec)
        if level and pred.get("level"):
            levels.append(level / float(pred["level"]))
        if pred.get("tokens_per_s") and rec.tokens_per_s:
            values.append(float(rec.tokens_per_s) / float(pred["tokens_per_s"]))
    if not values:
        return Correction()
    return Correction(statistics.median(levels) if levels else 1.0, statistics.median(values), len(values))


def predicted_twins(trials: Iterable[FrozenTrial], config: ServeConfig, pred: Prediction,
                    tolerance: float = TWIN_TOLERANCE) -> list[FrozenTrial]:
    """Measured trials of the same layout whose prediction is the same as ``pred`` (same
    feasibility and load, tokens/s within ``tolerance``): the simulator sees no effect of
    what differs between them and ``config`` (a knob this workload does not exercise), so
    launching ``config`` is expected to measure what they measured."""
    from optuna.trial import TrialState

    out = []
    for t in trials:
        rec = TrialRecord.from_trial(t)
        other = rec.prediction or {}
        if (t.state != TrialState.COMPLETE or rec.is_repeat or not other or rec.rejected_kind
                or rec.config is None or rec.config.tensor_parallel_size != config.tensor_parallel_size
                or rec.config.replicas != config.replicas):
            continue
        if bool(other.get("feasible")) != pred.feasible or float(other.get("level") or 0) != pred.level:
            continue
        ref = float(other.get("tokens_per_s") or 0.0)
        if abs(pred.tokens_per_s - ref) <= tolerance * max(ref, 1e-9) or (ref == 0 and pred.tokens_per_s == 0):
            out.append(t)
    return out


@dataclass(slots=True)
class Advice:
    """What the search does with a prediction (:func:`advise`)."""

    prediction: dict[str, Any] = field(default_factory=dict)  # stored on the trial
    start_level: float | None = None      # first load of the goodput search
    expected_value: float | None = None   # corrected predicted tokens/s (when trusted)
    prune: bool = False                   # do not launch: record the trial as PRUNED
    value: float = 0.0                    # the pruned trial's reported value
    reason: str = ""
    twin_of: int | None = None


def advise(trials: Sequence[FrozenTrial], config: ServeConfig, pred: Prediction | None,
           best: float | None, *, twin_share: float = TWIN_SHARE, objective: str = "tokens") -> Advice:
    """Turn ``pred`` into the search's next move, given the study's ``trials`` so far and
    its ``best`` measured value: where the goodput search starts (the predicted load x
    the measured/predicted median), what value to expect, and whether to launch at all.
    Not launched (pruned): a configuration whose corrected prediction is under
    ``PRUNE_SHARE`` of the best, one predicted infeasible once predictions are trusted,
    and a *predicted twin* (:func:`predicted_twins`) of a trial that measured under
    ``twin_share`` of the best (within it, a twin may be the best by noise), or of
    ``TWINS_MEASURED`` trials already measured. ``objective``: the unit of the trials'
    values and ``best`` in the reasons (:func:`tuner.serving.slo.value_text`)."""
    if pred is None:  # the simulator cannot model it, or vLLM would refuse it: the pre-check's call
        return Advice()
    corr = correction(trials)
    advice = Advice(prediction={**pred.to_dict(), "correction": {
        "level": corr.level, "tokens_per_s": corr.tokens_per_s, "matched": corr.matched}})
    twins = predicted_twins(trials, config, pred)
    twin = max(twins, key=lambda t: (float(t.value or 0.0), -t.number), default=None)
    if twin is not None and best and (len(twins) >= TWINS_MEASURED or float(twin.value or 0.0) < twin_share * best):
        value = float(twin.value or 0.0)
        other = TrialRecord.from_trial(twin).config
        differs = ", ".join(k for k, v in config.to_dict().items()
                            if other is None or getattr(other, k) != v) or "what differs"
        advice.prune, advice.value, advice.twin_of = True, value, twin.number
        why = (f"{len(twins)} such trials measured already" if len(twins) >= TWINS_MEASURED
               else f"under {twin_share:.0%} of the best {value_text(best, objective)}")
        advice.reason = (f"predicted the same as trial {twin.number} (same layout; the simulator sees no effect "
                         f"of {differs}), which measured {value_text(value, objective)}; {why}")
        return advice
    if not pred.feasible:
        advice.prediction["expected_tokens_per_s"] = 0.0
        if best and corr.trusted:
            advice.prune, advice.reason = True, f"predicted infeasible: {pred.reason}"
        return advice
    expected = pred.tokens_per_s * corr.tokens_per_s
    advice.prediction["expected_tokens_per_s"] = expected
    advice.start_level = pred.level * corr.level
    if corr.trusted:
        advice.expected_value = expected
        if best and expected < PRUNE_SHARE * best:
            advice.prune, advice.value = True, expected
            advice.reason = (f"predicted {expected:,.0f} tok/s (simulator x {corr.tokens_per_s:.2f}, the "
                             f"measured/predicted median of {corr.matched} trials), under {PRUNE_SHARE:.0%} of "
                             f"the best trial's {best:,.0f}")
    return advice


def _chosen_level(rec: TrialRecord) -> float | None:
    passed = [float(p.level) for p in rec.loads if p.passed and p.level is not None and math.isfinite(float(p.level))]
    return max(passed) if passed else None


__all__ = ["Advice", "Correction", "Prediction", "Predictor", "advise", "correction", "predicted_twins", "sim_predictor"]  # noqa: E501

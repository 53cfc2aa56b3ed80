"""The figures Optuna draws or computes for a study: the optimisation history and the
knobs' importances (PED-ANOVA), by the knob's name as the user types it."""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.plots._style import adopt, figure, style, styled
from tuner.study import is_feasible
from tuner.study.record import StudyRecord

if TYPE_CHECKING:
    import optuna
    from matplotlib.figure import Figure


def _measured_trials(study: optuna.Study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def value_label(study: optuna.Study) -> str:
    """What the study's trial values are, for an axis: ``tokens/s (in+out)``, or
    ``goodput (req/s meeting every SLO)`` for a study stamped ``--objective goodput``."""
    objective = StudyRecord.from_study(study).objective
    return "goodput (req/s meeting every SLO)" if objective == "goodput" else "tokens/s (in+out)"


def plot_history(study: optuna.Study) -> Figure:
    """Optuna's optimisation history: each trial's value (tokens/s, or goodput: the study's
    objective) and the best feasible so far."""
    import optuna.visualization.matplotlib as ovm

    if _measured_trials(study) == 0:
        raise InputError(f"study {study.study_name} has no completed trial yet", hint="run tuner search")
    infeasible = sum(1 for t in study.get_trials(deepcopy=False) if t.value is not None and not is_feasible(t))
    unit = value_label(study)
    with style(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning of the matplotlib backend
        ax = ovm.plot_optimization_history(study, target_name=unit)
        if infeasible:
            ax.scatter([], [], color="#cccccc", label=f"infeasible or refused ({infeasible})")
        handles, labels = ax.get_legend_handles_labels()
        names = {"Best Value": "best feasible so far", unit: "feasible trial"}
        ax.legend(handles, [names.get(label, label) for label in labels], loc="upper left",
                  bbox_to_anchor=(1.02, 1.0), fontsize=8)
        ax.set_title("", loc="left")
        ax.set_title(f"optimisation history: {unit.split(' (')[0]} per trial, best feasible so far")
        ax.set_xlabel("trial")
        return adopt(ax, 9.0, 4.5)


def knob_name(param: str) -> str:
    """The knob a trial parameter sets, as the user names it: Optuna stores an ordered
    choice (max_num_seqs: 32, 64, 128) as its index, ``max_num_seqs_index``
    (:attr:`tuner.space.Param.key`)."""
    return param.removesuffix("_index")


def knob_importances(study: optuna.Study) -> dict[str, float]:
    """Optuna's parameter importances of tokens/s (PED-ANOVA: how differently the best
    trials set each knob compared with all trials; needs no scikit-learn), by knob name,
    most important first, shares summing to 1. InputError when the study has too few
    completed trials or no knob made a difference."""
    import optuna

    complete = _measured_trials(study)
    if complete < 4:
        raise InputError(f"parameter importances need at least 4 completed trials, study has {complete}",
                         hint="run more trials: tuner search --budget N tops the study up")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            raw = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
        except (RuntimeError, ValueError) as err:
            raise InputError(f"cannot compute parameter importances: {err}") from err
    if not raw or not any(v > 0 for v in raw.values()):
        raise InputError("no knob changed tokens/s in this study (all importances are 0)",
                         hint="run more trials, or widen the search space")
    return {knob_name(k): float(v) for k, v in raw.items()}


@styled
def plot_importances(study: optuna.Study) -> Figure:
    """Which knobs mattered for tokens/s: :func:`knob_importances` as bars, the knob's
    name on each, its share at its end."""
    importances = knob_importances(study)
    names = list(importances)[::-1]  # most important at the top
    shares = [importances[n] for n in names]
    fig = figure(8.0, max(3.0, 0.45 * len(names) + 1.2))
    ax = fig.add_subplot()
    bars = ax.barh(names, shares, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:.0%}" if v >= 0.01 else "<1%" for v in shares], padding=3, fontsize=8)
    ax.set_xlim(0, max(shares) * 1.15)
    ax.set_title("which knobs mattered for tokens/s (PED-ANOVA importance)")
    ax.set_xlabel("importance (share of the total)")
    ax.grid(axis="y", alpha=0)
    fig.tight_layout()
    return fig

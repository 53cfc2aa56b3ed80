"""Figures of a study (matplotlib, Agg; nothing is shown on screen).

Each ``plot_*`` function returns a :class:`matplotlib.figure.Figure` that no pyplot
window owns (so a notebook shows it once, where it is displayed, and it can be saved
anywhere). :func:`study_plots` makes every figure a study supports, with a title and
a caption saying how to read it (written from the study's own values: its target, its
SLOs, what was drawn), for ``tuner report`` and the notebook; a figure the study cannot
support yet (too few trials, no capacity plan) is listed with the reason.

* history — Optuna's optimisation history: every trial's tokens/s (infeasible trials
  grey, at 0) and the best feasible value so far.
* importances — Optuna's parameter importances (PED-ANOVA: how much each knob's values
  differ between the best trials and the rest; needs no scikit-learn), by the knob's
  name (``max_num_seqs``, not Optuna's ``max_num_seqs_index``).
* tradeoff — tokens/s against P95 TTFT per trial, the target line, the Pareto front.
* ttft_by_load — P95 TTFT against load for the best configurations, the target line.
* per_user — output tokens/s per user against per GPU over every load point, the front.
* layouts — tokens/s by layout (tensor-parallel size x replicas).
* capacity — the load sweep of ``tuner plan``: P95 TTFT and tokens/s against load.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.plots._capacity import plot_capacity
from tuner.plots._captions import CAPTIONS, TITLES, Facts, caption
from tuner.plots._history import knob_importances, knob_name, plot_history, plot_importances, value_label
from tuner.plots._loads import load_points, per_user_front, plot_per_user_front, plot_ttft_by_load
from tuner.plots._style import SLO_COLORS, STATUS_COLORS, STYLE, png_bytes
from tuner.plots._tradeoff import plot_layouts, plot_tradeoff
from tuner.serving.slo import SloSet
from tuner.study.analysis import best_trial, plan_sweep, target_ttft_s, top_groups, trials_frame
from tuner.study.record import StudyRecord
from tuner.study.tables import TrialsTable, as_frame

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from matplotlib.figure import Figure

#: How many configurations :func:`plot_ttft_by_load` compares in a study's figures.
TOP_CONFIGS = 5


@dataclass(frozen=True, slots=True)
class StudyPlot:
    """One figure of a study: ``figure`` is ``None`` when the study cannot support it
    yet, and ``skipped`` says why."""

    name: str
    title: str
    caption: str
    figure: Figure | None = None
    skipped: str | None = None


def study_slos(study: optuna.Study) -> tuple[str, ...]:
    """The study's SLO set as typed, P95 TTFT first (from its record); empty when unknown."""
    target, others = target_ttft_s(study), StudyRecord.from_study(study).slos
    texts = ((f"p95:ttft<={target}s",) if target is not None else ()) + tuple(others)
    return SloSet.of(texts).texts if texts else ()


def _best_number(study: optuna.Study) -> int | None:
    best = best_trial(study)
    return None if best is None else best.number


def plan_command(study: optuna.Study) -> str:
    """The command that adds a capacity plan to ``study``, at its own target."""
    target = target_ttft_s(study)
    return f"tuner plan --study {study.study_name}" + (f" --target-ttft {target:g}s" if target else "")


def study_plots(study: optuna.Study, frame: TrialsTable | pd.DataFrame | None = None) -> list[StudyPlot]:
    """Every figure of :data:`CAPTIONS`, in that order, each with the caption of this
    study's values (skipped ones carry the reason). ``frame`` reuses a
    :func:`~tuner.study.analysis.trials_frame` of ``study``."""
    df = as_frame(frame) if frame is not None else trials_frame(study).frame
    target, slos, best = target_ttft_s(study), study_slos(study), _best_number(study)
    facts = Facts(target_s=target, slos=slos, objective=StudyRecord.from_study(study).objective)
    points = load_points(study)
    groups = top_groups(study, TOP_CONFIGS, frame=df).frame
    # each configuration's trials, the one that names it (its best measurement) first
    top = [(int(n), *[m for m in members if m != n]) for n, members in zip(groups["number"], groups["members"])]
    sweep = plan_sweep(study)

    def capacity() -> Figure:
        if sweep.plan is None:
            raise InputError("the study holds no capacity plan", hint=f"run {plan_command(study)}")
        return plot_capacity(sweep)

    missed = replace(facts, missed=bool(len(df)) and bool((df["value"].notna() & ~df["feasible"].astype(bool)).any()))
    makers: dict[str, tuple[Callable[[], Figure], Facts]] = {
        "history": (lambda: plot_history(study), missed),
        "importances": (lambda: plot_importances(study), facts),
        "tradeoff": (lambda: plot_tradeoff(df, target, best, slos), missed),
        "ttft_by_load": (lambda: plot_ttft_by_load(points, top, target, best),
                         replace(facts, configs=len(top), missed=not points[points["number"].isin(
                             [m for members in top for m in members])]["passed"].all())),
        "per_user": (lambda: plot_per_user_front(points, best),
                     replace(facts, missed=not per_user_front(points)["passed"].all())),
        "layouts": (lambda: plot_layouts(df), facts),
        "capacity": (capacity, replace(facts, slos=sweep.slos or slos, target_s=sweep.target_ttft_s or target,
                                       verify_runs=int(((sweep.frame["role"] == "verify")
                                                        & (sweep.frame["repeat"] == 0)).sum()))),
    }
    out = []
    for name, (make, said) in makers.items():
        title, text = TITLES[name], caption(name, said)
        try:
            out.append(StudyPlot(name, title, text, figure=make()))
        except InputError as err:
            out.append(StudyPlot(name, title, text, skipped=str(err)))
    return out


__all__ = [
    "CAPTIONS", "SLO_COLORS", "STATUS_COLORS", "STYLE", "StudyPlot", "knob_importances", "knob_name", "load_points",
    "per_user_front", "plan_command", "plot_capacity", "plot_history", "plot_importances", "plot_layouts", "plot_per_user_front",  # noqa: E501
    "plot_tradeoff", "plot_ttft_by_load", "png_bytes", "study_plots", "study_slos", "value_label",
]

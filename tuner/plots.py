"""Figures of a study (matplotlib, Agg; nothing is shown on screen).

Each ``plot_*`` function returns a :class:`matplotlib.figure.Figure` that no pyplot
window owns (so a notebook shows it once, where it is displayed, and it can be saved
anywhere). :func:`study_plots` makes every figure a study supports, with a title and
a caption saying how to read it, for ``tuner report`` and the notebook; a figure the
study cannot support yet (too few trials, no capacity plan) is listed with the reason.

* history — Optuna's optimisation history: every trial's tokens/s (infeasible trials
  grey, at 0) and the best feasible value so far.
* importances — Optuna's parameter importances (PED-ANOVA: how much each knob's values
  differ between the best trials and the rest; needs no scikit-learn), by the knob's
  name (``max_num_seqs``, not Optuna's ``max_num_seqs_index``).
* tradeoff — tokens/s against P95 TTFT per trial, the target line, the Pareto front.
* layouts — tokens/s by layout (tensor-parallel size x replicas).
* capacity — the load sweep of ``tuner plan``: P95 TTFT and tokens/s against load.
"""
from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.analysis import best_trial, pareto_mask, plan_sweep, target_ttft_s, trials_frame
from tuner.errors import InputError
from tuner.record import StudyRecord
from tuner.slo import SloSet
from tuner.study import is_feasible

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from matplotlib.figure import Figure

#: Marker colour per trial status (analysis.STATUSES).
STATUS_COLORS = {"feasible": "tab:blue", "infeasible": "tab:red", "refused": "tab:grey",
                 "failed": "black", "pruned": "tab:olive", "running": "tab:cyan"}


#: Marker colour per SLO of a study's set, in the order the study lists them (P95 TTFT first).
SLO_COLORS = ("tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:cyan", "tab:olive")

#: One look for every figure: Optuna's matplotlib plots use the ggplot style sheet.
STYLE = "ggplot"


def _style() -> Any:
    """Style context for drawing; it also undoes the ``plt.style.use`` Optuna's plots make."""
    import matplotlib.pyplot as plt

    return plt.style.context(STYLE)


def _styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Draw ``fn``'s figure in :data:`STYLE`."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with _style():
            return fn(*args, **kwargs)

    return wrapper


def _figure(width: float = 8.0, height: float = 4.5) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def _adopt(ax: object, width: float, height: float) -> Figure:
    """Take an Optuna-drawn figure away from pyplot (so that no backend shows it again)."""
    import matplotlib.pyplot as plt

    fig = ax.figure  # type: ignore[attr-defined]
    plt.close(fig)
    fig.set_size_inches(width, height)
    return fig


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (tight bounding box, white background)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    return buf.getvalue()


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
    with _style(), warnings.catch_warnings():
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
        return _adopt(ax, 9.0, 4.5)


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


@_styled
def plot_importances(study: optuna.Study) -> Figure:
    """Which knobs mattered for tokens/s: :func:`knob_importances` as bars, the knob's
    name on each, its share at its end."""
    importances = knob_importances(study)
    names = list(importances)[::-1]  # most important at the top
    shares = [importances[n] for n in names]
    fig = _figure(8.0, max(3.0, 0.45 * len(names) + 1.2))
    ax = fig.add_subplot()
    bars = ax.barh(names, shares, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:.0%}" if v >= 0.01 else "<1%" for v in shares], padding=3, fontsize=8)
    ax.set_xlim(0, max(shares) * 1.15)
    ax.set_title("which knobs mattered for tokens/s (PED-ANOVA importance)")
    ax.set_xlabel("importance (share of the total)")
    ax.grid(axis="y", alpha=0)
    fig.tight_layout()
    return fig


def _by_binding_slo(ax: Any, measured: pd.DataFrame, slos: Sequence[str]) -> None:
    """Each trial's marker in the colour of the SLO that binds it (the smallest margin at
    its scored load: :attr:`tuner.record.TrialRecord.binding_slo`), one legend entry per
    SLO with its count; the marker's shape is still its status (o feasible, x not)."""
    binding = measured["binding_slo"] if "binding_slo" in measured else measured["number"].map(lambda _: None)
    groups = [(text, SLO_COLORS[i % len(SLO_COLORS)], measured[binding == text], f"{text} binds")
              for i, text in enumerate(slos)]
    groups.append((None, "tab:grey", measured[~binding.isin(slos)], "binding SLO not recorded"))
    for text, colour, rows, label in groups:
        if text is None and rows.empty:
            continue
        for feasible, group in rows.groupby(rows["feasible"].astype(bool)):
            ax.scatter(group["ttft_p95_s"], group["tokens_per_s"], s=36, alpha=0.9, color=colour,
                       marker="o" if feasible else "x", zorder=3)
        ax.scatter([], [], s=36, color=colour, marker="s", label=f"{label} ({len(rows)})")
    for marker, status in (("o", "feasible"), ("x", "not feasible")):
        ax.scatter([], [], s=36, color="black", marker=marker, label=status)


@_styled
def plot_tradeoff(frame: pd.DataFrame, target_s: float | None = None, best: int | None = None,
                  slos: Sequence[str] = ()) -> Figure:
    """tokens/s against P95 TTFT, one marker per measured trial (colour: status; for a
    study of several SLOs, ``slos`` as typed, the SLO that binds it), the target as a
    vertical line, the Pareto front as a step line, the best feasible trial
    starred: trial ``best`` (the study's recommendation, :func:`tuner.analysis.best_trial`,
    which a confirmation may have chosen over a luckier single measurement), or the
    fastest feasible one. ``frame`` is :func:`tuner.analysis.trials_frame`."""
    target = target_s if target_s is not None else frame.attrs.get("target_ttft_s")
    measured = frame[frame["tokens_per_s"].notna() & frame["ttft_p95_s"].notna()]
    if measured.empty:
        raise InputError("no trial measured P95 TTFT and throughput yet", hint="run tuner search")
    fig = _figure(8.0, 5.0)
    ax = fig.add_subplot()
    if len(slos) > 1:
        _by_binding_slo(ax, measured, slos)
    else:
        for status, group in measured.groupby("status", sort=False):
            ax.scatter(group["ttft_p95_s"], group["tokens_per_s"], s=36, alpha=0.8,
                       color=STATUS_COLORS.get(str(status), "tab:purple"),
                       marker="o" if status == "feasible" else "x", label=f"{status} ({len(group)})")
    front = measured[pareto_mask(measured)].sort_values("ttft_p95_s")
    if len(front):
        ax.step(front["ttft_p95_s"], front["tokens_per_s"], where="post", color="tab:green",
                linewidth=1.5, label="Pareto front")
    feasible = measured[measured["feasible"].astype(bool)]
    if len(feasible):
        chosen = feasible[feasible["number"] == best] if best is not None else feasible.iloc[:0]
        star = (chosen if len(chosen) else
                feasible.sort_values(["tokens_per_s", "number"], ascending=[False, True])).iloc[0]
        ax.scatter([star["ttft_p95_s"]], [star["tokens_per_s"]], marker="*", s=260, color="gold",
                   edgecolor="black", zorder=5, label=f"best feasible (#{int(star['number'])})")
    if target:
        ax.axvline(target, color="red", linestyle="--", label=f"target P95 TTFT {target:g} s")
        ax.axvspan(0, target, color="tab:green", alpha=0.12)
    unmeasured = len(frame) - len(measured)
    if unmeasured:
        ax.scatter([], [], marker="", label=f"not shown: {unmeasured} never measured (refused, failed)")
    ax.set_xlabel("P95 TTFT at the chosen load (s)")
    ax.set_ylabel("tokens/s (in+out)")
    ax.set_title("throughput against P95 TTFT (" + ("P95 TTFT met in the shade; colour: the SLO that binds)"
                                                   if len(slos) > 1 else "feasible region shaded)"))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def _layout_key(name: str) -> tuple[int, int]:
    tp, _, reps = name.removeprefix("tp").partition("x")
    return (int(tp), int(reps)) if tp.isdigit() and reps.isdigit() else (math.inf, 0)  # type: ignore[return-value]


@_styled
def plot_layouts(frame: pd.DataFrame) -> Figure:
    """tokens/s of the feasible trials by layout (``tp<TP>x<replicas>``): one box per
    layout with every trial as a dot; under each box, how many trials ran it and how many
    were infeasible or refused. InputError when the study tried one layout only."""
    if frame.empty:
        raise InputError("the study has no trials yet", hint="run tuner search")
    layouts = sorted(frame["layout"].dropna().unique(), key=_layout_key)
    if len(layouts) < 2:
        raise InputError(f"only one layout was tried ({', '.join(layouts) or 'none'}): there is nothing to compare",
                         hint="a deployment of several GPUs (--gpus) lets the search try TP x replicas")
    fig = _figure(max(5.0, 1.6 * len(layouts) + 2.0), 4.5)
    ax = fig.add_subplot()
    data, labels = [], []
    for i, layout in enumerate(layouts):
        rows = frame[frame["layout"] == layout]
        ok = rows[rows["feasible"].astype(bool)]["tokens_per_s"].astype(float).dropna()
        data.append(ok.to_numpy())
        bad = int((~rows["feasible"].astype(bool)).sum())
        labels.append(f"{layout}\n{len(rows)} trials, {bad} not feasible")
        jitter = [i + 1 + 0.08 * ((k % 5) - 2) for k in range(len(ok))]
        ax.scatter(jitter, ok, s=18, color="tab:blue", alpha=0.7, zorder=3)
    ax.boxplot([d if len(d) else [math.nan] for d in data], showfliers=False, widths=0.5)
    ax.set_xticks(range(1, len(layouts) + 1), labels, fontsize=8)
    ax.set_ylabel("tokens/s (in+out), feasible trials")
    ax.set_title("throughput by layout (tensor-parallel size x replicas)")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


@_styled
def plot_capacity(sweep: pd.DataFrame) -> Figure:
    """The capacity curve of ``tuner plan``: P95 TTFT (left axis) and tokens/s (right
    axis) against load, the target line, and the largest load meeting it; for a plan of
    several SLOs each run's marker is in the colour of the SLO that limits it. ``sweep`` is
    :func:`tuner.analysis.plan_sweep`."""
    if sweep.empty:
        raise InputError("the study holds no capacity plan", hint="run tuner plan --target-ttft 2s on it")
    at = sweep.attrs
    rows = sweep[sweep["repeat"] == 0].sort_values("level")
    curve = rows[rows["role"] != "verify"]
    fig = _figure(8.0, 4.8)
    ax = fig.add_subplot()
    slos = tuple(at.get("slos") or ()) if "binding_slo" in rows else ()
    verify = rows[rows["role"] == "verify"]
    if len(slos) > 1:
        # the curve, and each run in the colour of the SLO that limits it there (tuner plan's "limit")
        ax.plot(curve["level"], curve["ttft_p95_s"], "-", color="black", alpha=0.5, label="P95 TTFT")
        for i, text in enumerate(slos):
            colour = SLO_COLORS[i % len(SLO_COLORS)]
            runs, checks = curve[curve["binding_slo"] == text], verify[verify["binding_slo"] == text]
            ax.plot(runs["level"], runs["ttft_p95_s"], "o", color=colour, linestyle="none", zorder=4,
                    label=f"{text} limits ({len(runs) + len(checks)})")
            ax.plot(checks["level"], checks["ttft_p95_s"], "D", color=colour, mec="black", ms=8, linestyle="none",
                    zorder=5)
        if len(verify):
            ax.plot([], [], "D", color="white", mec="black", ms=8, linestyle="none", label="verify run")
    else:
        ax.plot(curve["level"], curve["ttft_p95_s"], "o-", color="tab:purple", label="P95 TTFT")
    if len(verify) and len(slos) <= 1:
        # filled and outlined, so that the legend shows it as clearly as the plot does
        ax.plot(verify["level"], verify["ttft_p95_s"], "D", color="tab:orange", mec="black", ms=8,
                linestyle="none", zorder=5, label="verify run")
    ax.axhline(at["target_ttft_s"], color="red", linestyle="--", label=f"target {at['target_ttft_s']:g} s")
    unit = "users" if at.get("load_kind") == "concurrency" else "req/s"
    ax.axvline(at["max_load"], color="grey", linestyle=":",
               label=f"capacity {'≥ ' if at.get('bound') == 'at_least' else ''}{at['max_load']:g} {unit}")
    ax.set_xlabel("concurrent users" if unit == "users" else "requests/s")
    ax.set_ylabel("P95 TTFT (s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(curve["level"], curve["tokens_per_s"], "s--", color="tab:blue", label="tokens/s (in+out)")
    ax2.set_ylabel("tokens/s (in+out)")
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    # on the twin axes, which are drawn last: no line of either axes crosses the legend
    ax2.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8, framealpha=1.0,
               facecolor="white")
    ax.set_title(f"capacity curve ({at.get('plan')}): {at['tokens_per_s']:,.0f} tokens/s at the target")
    fig.tight_layout()
    return fig


@dataclass(frozen=True, slots=True)
class StudyPlot:
    """One figure of a study: ``figure`` is ``None`` when the study cannot support it
    yet, and ``skipped`` says why."""

    name: str
    title: str
    caption: str
    figure: Figure | None = None
    skipped: str | None = None


CAPTIONS = {
    "history": ("Optimisation history",
                "Each dot is a trial's throughput at its highest load meeting the P95 TTFT target; grey dots "
                "(at 0) did not meet the target or were refused by vLLM. The line is the best feasible "
                "throughput so far: a long flat tail means more trials are unlikely to help."),
    "importances": ("Knob importance",
                    "How much each knob explains throughput (PED-ANOVA: how differently the best trials "
                    "set it compared with all trials). Spend tuning effort on the top knobs; the bottom ones "
                    "can stay at vLLM's defaults."),
    "tradeoff": ("Throughput against P95 TTFT",
                 "Each trial at the load it was scored at (infeasible trials at their lowest load). Left of "
                 "the red line is the feasible region; the green steps are the Pareto front: configurations "
                 "that no other beats on both latency and throughput. The star is the answer. In a study of "
                 "several SLOs each trial's colour is the SLO that binds it (the smallest margin at its load), "
                 "and a cross left of the line missed another SLO."),
    "layouts": ("Throughput by layout",
                "Feasible throughput per GPU layout (tensor-parallel size x replicas). More replicas usually "
                "win throughput; more TP frees memory for KV cache and cuts per-token latency."),
    "capacity": ("Capacity curve",
                 "The load sweep of tuner plan on the chosen configuration: P95 TTFT rises with load; the "
                 "grey line is the most load that stays under the target, the capacity to plan with, and the "
                 "orange diamonds are the runs that verified it. In a plan of several SLOs each run's colour is "
                 "the SLO that limits it there (tuner plan's limit column)."),
}


def study_slos(study: optuna.Study) -> tuple[str, ...]:
    """The study's SLO set as typed, P95 TTFT first (from its record); empty when unknown."""
    target, others = target_ttft_s(study), StudyRecord.from_study(study).slos
    texts = ((f"p95:ttft<={target}s",) if target is not None else ()) + tuple(others)
    return SloSet.of(texts).texts if texts else ()


def _best_number(study: optuna.Study) -> int | None:
    best = best_trial(study)
    return None if best is None else best.number


def study_plots(study: optuna.Study, frame: pd.DataFrame | None = None) -> list[StudyPlot]:
    """Every figure of :data:`CAPTIONS`, in that order (skipped ones carry the reason)."""
    df = frame if frame is not None else trials_frame(study)
    makers: dict[str, Callable[[], Figure]] = {
        "history": lambda: plot_history(study),
        "importances": lambda: plot_importances(study),
        "tradeoff": lambda: plot_tradeoff(df, target_ttft_s(study), _best_number(study), study_slos(study)),
        "layouts": lambda: plot_layouts(df),
        "capacity": lambda: plot_capacity(plan_sweep(study)),
    }
    out = []
    for name, make in makers.items():
        title, caption = CAPTIONS[name]
        try:
            out.append(StudyPlot(name, title, caption, figure=make()))
        except InputError as err:
            out.append(StudyPlot(name, title, caption, skipped=str(err)))
    return out


__all__ = [
    "CAPTIONS", "StudyPlot", "knob_importances", "knob_name", "plot_capacity", "plot_history", "plot_importances",
    "plot_layouts", "plot_tradeoff", "png_bytes", "study_plots",
]

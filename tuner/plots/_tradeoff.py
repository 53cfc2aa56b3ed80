"""Throughput against P95 TTFT per trial (the target, the Pareto front, the answer
starred) and throughput by GPU layout."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.plots._style import SLO_COLORS, STATUS_COLORS, figure, styled
from tuner.study.analysis import pareto_mask
from tuner.study.tables import TrialsTable, as_frame

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


def _by_binding_slo(ax: Any, measured: pd.DataFrame, slos: Sequence[str]) -> None:
    """Each trial's marker in the colour of the SLO that binds it (the smallest margin at
    its scored load: :attr:`tuner.study.record.TrialRecord.binding_slo`), one legend entry per
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


@styled
def plot_tradeoff(frame: TrialsTable | pd.DataFrame, target_s: float | None = None, best: int | None = None,
                  slos: Sequence[str] = ()) -> Figure:
    """tokens/s against P95 TTFT, one marker per measured trial (colour: status; for a
    study of several SLOs, ``slos`` as typed, the SLO that binds it), the target as a
    vertical line, the Pareto front as a step line, the best feasible trial
    starred: trial ``best`` (the study's recommendation, :func:`tuner.study.analysis.best_trial`,
    which a confirmation may have chosen over a luckier single measurement), or the
    fastest feasible one. ``frame`` is :func:`tuner.study.analysis.trials_frame` (whose target
    and recommended trial are drawn where ``target_s`` / ``best`` are not given) or a
    DataFrame of its rows."""
    if isinstance(frame, TrialsTable):
        target_s = frame.target_ttft_s if target_s is None else target_s
        best = frame.recommended if best is None else best
    target, frame = target_s, as_frame(frame)
    measured = frame[frame["tokens_per_s"].notna() & frame["ttft_p95_s"].notna()]
    if measured.empty:
        raise InputError("no trial measured P95 TTFT and throughput yet", hint="run tuner search")
    fig = figure(8.0, 5.0)
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


@styled
def plot_layouts(frame: TrialsTable | pd.DataFrame) -> Figure:
    """tokens/s of the feasible trials by layout (``tp<TP>x<replicas>``): one box per
    layout with every trial as a dot; under each box, how many trials ran it and how many
    were infeasible or refused. InputError when the study tried one layout only. ``frame``
    is :func:`tuner.study.analysis.trials_frame` or a DataFrame of its rows."""
    frame = as_frame(frame)
    if frame.empty:
        raise InputError("the study has no trials yet", hint="run tuner search")
    layouts = sorted(frame["layout"].dropna().unique(), key=_layout_key)
    if len(layouts) < 2:
        raise InputError(f"only one layout was tried ({', '.join(layouts) or 'none'}): there is nothing to compare",
                         hint="a deployment of several GPUs (--gpus) lets the search try TP x replicas")
    fig = figure(max(5.0, 1.6 * len(layouts) + 2.0), 4.5)
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

"""What the trials measured at each load they tried: P95 TTFT against load for the top
configurations, and the front of output tokens/s per user against output tokens/s per
GPU (what ``vllm bench sweep plot_pareto`` draws) over every load point."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.plots._style import CONFIG_COLORS, figure, styled
from tuner.study.analysis import pareto_mask
from tuner.study.record import TrialRecord

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from matplotlib.figure import Figure

#: Columns of :func:`load_points`.
POINT_COLUMNS = ("number", "load", "level", "load_kind", "p95_ttft_s", "tokens_per_s", "output_tokens_per_s",
                 "error_rate", "stopped_early", "passed", "gpus", "layout")

#: Markers of the configurations :func:`plot_ttft_by_load` compares, best first.
_MARKERS = ("o", "s", "^", "D", "v")


def load_points(study: optuna.Study) -> pd.DataFrame:
    """Every load point of every measured trial, one row each (:data:`POINT_COLUMNS`), by
    trial and level; a trial copied from an earlier one (``repeat_of``) and confirmation
    repeats are left out. ``passed``: the point met every SLO of the study.
    ``output_tokens_per_s`` is known only for a point that ran to the end with every
    request answered: its tokens/s times the output share of the workload's tokens (the
    same requests at every load; the share is the trial's summary's), else NaN."""
    import math

    import pandas as pd

    rows = []
    for trial in study.get_trials(deepcopy=False):
        rec = TrialRecord.from_trial(trial)
        if rec.is_repeat or rec.is_confirmation or not rec.loads:
            continue
        total, out = rec.summary.get("tokens_per_s"), rec.summary.get("output_tokens_per_s")
        share = out / total if total and out is not None else math.nan
        tp = rec.config.tensor_parallel_size if rec.config is not None else 1
        replicas = rec.config.replicas if rec.config is not None else 1
        for p in rec.loads:
            whole = not p.stopped_early and not p.error_rate and p.tokens_per_s is not None
            rows.append({"number": trial.number, "load": p.load, "level": p.level, "load_kind": rec.run.load_kind,
                         "p95_ttft_s": p.p95_ttft_s, "tokens_per_s": p.tokens_per_s,
                         "output_tokens_per_s": p.tokens_per_s * share if whole else math.nan,
                         "error_rate": p.error_rate, "stopped_early": p.stopped_early, "passed": p.passed,
                         "gpus": tp * replicas, "layout": f"tp{tp}x{replicas}"})
    frame = pd.DataFrame(rows, columns=list(POINT_COLUMNS))
    for col in ("level", "p95_ttft_s", "tokens_per_s", "output_tokens_per_s", "error_rate"):
        frame[col] = frame[col].astype(float)
    return frame.sort_values(["number", "level"]).reset_index(drop=True)


def _load_axis(points: pd.DataFrame) -> str:
    kinds = set(points["load_kind"].dropna())
    return "requests/s" if kinds == {"rate"} else "concurrent users"


@styled
def plot_ttft_by_load(points: pd.DataFrame, top: Sequence[Sequence[int]], target_s: float | None = None,
                      recommended: int | None = None) -> Figure:
    """P95 TTFT against load for a few configurations, best first: ``top`` holds each
    one's trial numbers (the first names it; trials of one effective configuration pool
    their points, the median at a load each tried), a filled marker where the load met
    every SLO, a hollow one where it did not; the target as a horizontal line; ★ in the
    legend marks the configuration of trial ``recommended``. ``points`` is
    :func:`load_points`."""
    curves = []
    for members in top:
        rows = points[points["number"].isin(members) & points["p95_ttft_s"].notna()]
        if len(rows):
            curves.append((members, rows.groupby("level").agg(p95=("p95_ttft_s", "median"),
                                                              passed=("passed", "all")).reset_index()))
    if not curves:
        raise InputError("no feasible trial recorded its load points yet", hint="run tuner search")
    fig = figure(8.0, 4.8)
    ax = fig.add_subplot()
    hollow = False
    for i, (members, curve) in enumerate(curves):
        colour, marker = CONFIG_COLORS[i % len(CONFIG_COLORS)], _MARKERS[i % len(_MARKERS)]
        star = " ★" if recommended is not None and recommended in members else ""
        layout = points.loc[points["number"] == members[0], "layout"].iloc[0]
        z = 3 + 2 * (len(curves) - i)  # the best on top where configurations measured alike
        ax.plot(curve["level"], curve["p95"], "-", color=colour, alpha=0.6, zorder=z)
        for passed, face in ((True, colour), (False, "white")):
            part = curve[curve["passed"] == passed]
            ax.plot(part["level"], part["p95"], marker, color=colour, mfc=face, ms=7, linestyle="none", zorder=z + 1)
        hollow = hollow or not curve["passed"].all()
        ax.plot([], [], marker + "-", color=colour, label=f"#{members[0]}{star} ({layout})")
    if hollow:
        ax.plot([], [], "o", color="grey", mfc="white", linestyle="none", label="hollow: missed at that load")
    if target_s:
        ax.axhline(target_s, color="red", linestyle="--", label=f"target P95 TTFT {target_s:g} s")
    ax.set_xlabel(_load_axis(points))
    ax.set_ylabel("P95 TTFT (s)")
    levels = [level for _, curve in curves for level in curve["level"]]
    if max(levels) - min(levels) < 0.1 * max(levels):  # (nearly) one load: placed on an axis from no load
        ax.set_xlim(left=0, right=max(levels) * 1.05)
    ax.set_ylim(bottom=0)
    ax.set_title(f"P95 TTFT against load: the {len(curves)} best configuration{'s' if len(curves) > 1 else ''}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, framealpha=1.0, facecolor="white")
    fig.tight_layout()
    return fig


def per_user_front(points: pd.DataFrame) -> pd.DataFrame:
    """The load points that ran whole at a concurrency, with ``per_user`` (output
    tokens/s over the concurrency) and ``per_gpu`` (over tensor-parallel size x
    replicas), and ``front``: no other point that met the SLOs is at least as fast per
    user and per GPU (points that missed one are never on it)."""
    rows = points[(points["load_kind"] == "concurrency") & points["output_tokens_per_s"].notna()
                  & (points["level"] > 0)].copy()
    rows["per_user"] = rows["output_tokens_per_s"] / rows["level"]
    rows["per_gpu"] = rows["output_tokens_per_s"] / rows["gpus"]
    rows["slower_per_user"] = -rows["per_user"]  # pareto_mask keeps low x, high y
    ok = rows[rows["passed"].astype(bool)]
    rows["front"] = pareto_mask(ok, x="slower_per_user", y="per_gpu").reindex(rows.index, fill_value=False)
    return rows.drop(columns="slower_per_user")


@styled
def plot_per_user_front(points: pd.DataFrame, recommended: int | None = None) -> Figure:
    """Output tokens/s per user against output tokens/s per GPU, one marker per load point
    of :func:`per_user_front` (hollow grey: it missed an SLO), the Pareto front as a line
    through its points, and trial ``recommended``'s fastest point meeting the SLOs
    starred. InputError when the study's load is a request rate (no users to divide by)."""
    if len(points) and set(points["load_kind"].dropna()) == {"rate"}:
        raise InputError("the per-user front needs a concurrency load; this study's load is a request rate")
    rows = per_user_front(points)
    if rows.empty:
        raise InputError("no load point ran to the end yet", hint="run tuner search")
    fig = figure(8.0, 4.8)
    ax = fig.add_subplot()
    met = rows[rows["passed"].astype(bool)]
    missed = rows[~rows["passed"].astype(bool)]
    if len(missed):
        ax.scatter(missed["per_user"], missed["per_gpu"], s=28, facecolor="white", edgecolor="grey",
                   label=f"missed an SLO ({len(missed)})", zorder=2)
    ax.scatter(met["per_user"], met["per_gpu"], s=28, color="tab:blue", alpha=0.7,
               label=f"met every SLO ({len(met)})", zorder=3)
    front = rows[rows["front"]].sort_values("per_user")
    ax.plot(front["per_user"], front["per_gpu"], "o-", color="tab:green", ms=8, zorder=4,
            label=f"Pareto front ({len(front)})")
    mine = met[met["number"] == recommended] if recommended is not None else met.iloc[:0]
    if len(mine):
        star = mine.sort_values("per_gpu").iloc[-1]
        ax.scatter([star["per_user"]], [star["per_gpu"]], marker="*", s=260, color="gold", edgecolor="black",
                   zorder=5, label=f"recommended (#{recommended}, {star['level']:g} users)")
    ax.set_xlabel("output tokens/s per user (output tokens/s ÷ concurrent users)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title("per-user against per-GPU output throughput, every load point")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8, framealpha=1.0, facecolor="white")
    fig.tight_layout()
    return fig

"""The capacity curve of ``tuner plan``: P95 TTFT and tokens/s against load."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.plots._style import SLO_COLORS, figure, styled
from tuner.study.tables import PlanSweep

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@styled
def plot_capacity(sweep: PlanSweep) -> Figure:
    """The capacity curve of ``tuner plan``: P95 TTFT (left axis) and tokens/s (right
    axis) against load, the target line, and the largest load meeting it; for a plan of
    several SLOs each run's marker is in the colour of the SLO that limits it. ``sweep`` is
    :func:`tuner.study.analysis.plan_sweep` (its rows may be filtered:
    ``dataclasses.replace(sweep, frame=...)``)."""
    if not isinstance(sweep, PlanSweep):
        raise InputError(f"sweep must be the PlanSweep of tuner.study.analysis.plan_sweep, got "
                         f"{type(sweep).__name__}", argument="sweep",
                         hint="its frame alone does not say the plan's target and capacity")
    if sweep.plan is None or sweep.target_ttft_s is None or sweep.max_load is None:
        raise InputError("the study holds no capacity plan", hint="run tuner plan on the study")
    if sweep.empty:
        raise InputError(f"the sweep of plan {sweep.plan} has no runs to draw", argument="sweep",
                         hint="keep some of the rows of analysis.plan_sweep(study)")
    rows = sweep.frame[sweep.frame["repeat"] == 0].sort_values("level")
    curve = rows[rows["role"] != "verify"]
    fig = figure(8.0, 4.8)
    ax = fig.add_subplot()
    slos = sweep.slos if "binding_slo" in rows else ()
    verify = rows[rows["role"] == "verify"]
    if len(slos) > 1:
        # the curve, and each run in the colour of the SLO that limits it there (tuner plan's "limit")
        ax.plot(curve["level"], curve["ttft_p95_s"], "-", color="black", alpha=0.5, label="P95 TTFT")
        for i, text in enumerate(slos):
            colour = SLO_COLORS[i % len(SLO_COLORS)]
            runs, checks = curve[curve["binding_slo"] == text], verify[verify["binding_slo"] == text]
            count = len(runs) + len(checks)  # an SLO that limits no run has no entry: nothing of it is drawn
            ax.plot(runs["level"], runs["ttft_p95_s"], "o", color=colour, linestyle="none", zorder=4,
                    label=f"{text} limits ({count})" if count else None)
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
    ax.axhline(sweep.target_ttft_s, color="red", linestyle="--", label=f"target {sweep.target_ttft_s:g} s")
    unit = "users" if sweep.load_kind == "concurrency" else "req/s"
    ax.axvline(sweep.max_load, color="grey", linestyle=":",
               label=f"capacity {'≥ ' if sweep.bound == 'at_least' else ''}{sweep.max_load:g} {unit}")
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
    held = "" if sweep.tokens_per_s is None else f": {sweep.tokens_per_s:,.0f} tokens/s at the target"
    ax.set_title(f"capacity curve ({sweep.plan}){held}")
    fig.tight_layout()
    return fig

"""What a plan is shown as: its summary rows, its sweep, Markdown and a PNG
(:func:`write_plan_files`, beside the study by default)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tuner.core.files import write_atomic
from tuner.plots import png_bytes
from tuner.serving.capacity import CapacityEstimate, ReplayedWorkload, SweepPoint
from tuner.serving.slo import monotone_fit
from tuner.study.storage import STUDIES_DIR


# -- reports ------------------------------------------------------------------------------
def _fmt_range(est: CapacityEstimate, key: str, value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    text = format(value, fmt)
    if key in est.ranges:
        lo, hi = est.ranges[key]
        text += f" ({format(lo, fmt)}–{format(hi, fmt)})"
    return text


def summary_rows(est: CapacityEstimate) -> list[tuple[str, str]]:
    """The capacity summary as (label, value) rows; ranges over repeats in brackets."""
    axis = "users" if est.load_kind == "concurrency" else "req/s"
    at_least = "≥ " if est.bound == "at_least" else ""
    rows = [
        ("target", f"P95 TTFT ≤ {est.target_ttft_s:g} s" + "".join(f", {s}" for s in est.slos)),
        ("max concurrency", at_least + _fmt_range(est, "max_concurrency", est.max_concurrency,
                                                  ",.0f" if est.load_kind == "concurrency" else ",.1f")
         + ("" if est.load_kind == "concurrency" else " (Little's law)")),
    ]
    if est.load_kind == "rate":
        rows.append(("max load", at_least + _fmt_range(est, "max_load", est.max_load, ",.3g") + f" {axis}"))
    rows += [
        ("P95 / mean TTFT there", f"{est.ttft_p95_s:.2f} s / {est.ttft_mean_s:.2f} s"
                                  + ("" if est.verified else " (verify missed; see notes)")),
        ("requests/s", _fmt_range(est, "requests_per_s", est.requests_per_s, ",.2f")),
        *((("goodput (req/s meeting every SLO)", f"{est.goodput_requests_per_s:,.2f}"),
           ("limited by", str(est.binding_slo))) if est.slos and est.goodput_requests_per_s is not None else ()),
        ("tokens/s (in+out)", _fmt_range(est, "tokens_per_s", est.tokens_per_s, ",.0f")),
        ("output tokens/s", _fmt_range(est, "output_tokens_per_s", est.output_tokens_per_s, ",.0f")),
    ]
    per = (f"{est.tokens_per_conversation:,.0f} tokens/conversation" if est.conversation_basis == "tokens"
           else f"{est.requests_per_conversation:.2f} requests/conversation")
    rows.append(("conversations/min", _fmt_range(est, "conversations_per_min", est.conversations_per_min, ",.0f")
                 + f" at {per}"))
    gpus = f"{est.gpus} GPU{'s' * (est.gpus != 1)}"
    if est.demand_per_min is not None:
        rows.append(("replicas", _fmt_range(est, "replicas", est.replicas, "d")
                     + f" for {est.demand_per_min:,.0f} {est.demand_unit}/min (+{est.headroom:.0%} headroom, "
                     + f"{gpus} each)"))
    if est.gpu_hour_cost is not None:
        rows.append(("cost per hour", f"{est.cost_per_hour:,.2f} per deployment ({gpus} x {est.gpu_hour_cost:g})"
                     + ("" if est.total_cost_per_hour is None else f", {est.total_cost_per_hour:,.2f} for all replicas")))  # noqa: E501
        rows.append(("cost per 1M tokens", _fmt_range(est, "cost_per_million_tokens",
                                                           est.cost_per_million_tokens, ",.3f")
                     + ("" if est.cost_per_million_output_tokens is None
                        else f" (output tokens only: {est.cost_per_million_output_tokens:,.3f})")))
    return rows


def sweep_rows(est: CapacityEstimate, repeat: int = 0) -> list[SweepPoint]:
    """The points of one repeat, by load."""
    return sorted((p for p in est.sweep if p.repeat == repeat), key=lambda p: (p.level, p.role))


def workload_line(w: ReplayedWorkload | None) -> str:
    """The replayed workload in one line: source, requests, fingerprint, and the study's."""
    if w is None:
        return "not recorded"
    line = f"{w.source} ({w.requests:,} requests, fingerprint {w.fingerprint})"
    if w.match == "same":
        return line + ", the study's own"
    if w.study_fingerprint is not None:
        line += f"; the study searched on {w.study_requests or '?'} requests, fingerprint {w.study_fingerprint}"
    return line


def render_markdown(est: CapacityEstimate) -> str:
    axis = "concurrency" if est.load_kind == "concurrency" else "req/s"
    where = f"study `{est.study}` trial {est.trial}" if est.study else "a configuration given directly"
    knobs = ", ".join(f"{k}={v}" for k, v in est.config.items() if v is not None)
    dep = est.deployment
    lines = [
        f"# Capacity at P95 TTFT ≤ {est.target_ttft_s:g} s",
        "",
        f"{where}; {dep.get('gpu_count')}x {dep.get('gpu')}, {dep.get('model')}, vLLM {dep.get('vllm_version')}; "
        f"backend `{est.backend}`; workload {workload_line(est.workload)}.",
        "",
        f"Configuration: {knobs}",
        "",
        f"| {axis} | mean TTFT | P95 TTFT | mean TPOT | mean E2E | tokens/s | output tokens/s | req/s | run |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in sweep_rows(est):
        lines.append(
            f"| {p.level:.4g} | {p.ttft_mean_s * 1e3:,.0f} ms | {p.ttft_p95_s:.2f} s | {p.tpot_mean_s * 1e3:.1f} ms | "
            f"{p.e2e_mean_s:.1f} s | {p.tokens_per_s:,.0f} | {p.output_tokens_per_s:,.0f} | {p.requests_per_s:.2f} | "
            f"{p.role} |")
    lines += ["", "| capacity | |", "|---|---:|"]
    lines += [f"| {a} | {b} |" for a, b in summary_rows(est)]
    if est.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in est.notes]
    return "\n".join(lines) + "\n"


def plot_plan(est: CapacityEstimate, path: str | Path) -> Path:
    """PNG: tokens/s and P95 TTFT against load, the target line and the chosen point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in sweep_rows(est) if p.role != "verify"]
    chosen = min(sweep_rows(est), key=lambda p: abs(p.level - est.max_load))
    x = [p.level for p in pts]
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(7, 6.5))
    ax1.plot(x, [p.tokens_per_s for p in pts], "o-", label="tokens/s (in+out)")
    ax1.plot(x, [p.output_tokens_per_s for p in pts], "s--", label="output tokens/s")
    ax1.plot([chosen.level], [chosen.tokens_per_s], "r*", markersize=14, label="chosen")
    ax1.set_ylabel("tokens/s")
    ax1.legend(loc="lower right")
    ax1.grid(alpha=0.3)
    ax2.plot(x, [p.ttft_p95_s for p in pts], "o", color="tab:purple", label="P95 TTFT (measured)")
    xs, ys = monotone_fit((p.level, p.ttft_p95_s) for p in sweep_rows(est))  # every repeat, by the plan's rule
    if len(xs) > 1 and np.all(np.isfinite(ys)):
        from scipy.interpolate import PchipInterpolator

        grid = np.linspace(xs[0], xs[-1], 200)
        ax2.plot(grid, PchipInterpolator(xs, ys)(grid), "-", color="tab:purple", alpha=0.6,
                 label="monotone (PCHIP) fit")
    ax2.axhline(est.target_ttft_s, color="r", linestyle=":", label=f"target {est.target_ttft_s:g} s")
    ax2.plot([chosen.level], [chosen.ttft_p95_s], "r*", markersize=14)
    ax2.axvline(est.max_load, color="grey", linestyle="--", linewidth=0.8)
    ax2.set_ylabel("P95 TTFT (s)")
    ax2.set_xlabel("concurrent users" if est.load_kind == "concurrency" else "requests/s")
    ax2.legend(loc="upper left")
    ax2.grid(alpha=0.3)
    fig.suptitle(f"capacity at P95 TTFT ≤ {est.target_ttft_s:g} s: {est.max_load:.4g} "
                 f"{'users' if est.load_kind == 'concurrency' else 'req/s'}, {est.tokens_per_s:,.0f} tok/s")
    fig.tight_layout()

    data = png_bytes(fig, dpi=110)
    plt.close(fig)
    return write_atomic(Path(path), data)


def default_out_dir(est: CapacityEstimate) -> Path:
    """``studies/<study>/`` beside the study's database, else ``studies/plans/``."""
    return STUDIES_DIR / (est.study or "plans")


def write_plan_files(est: CapacityEstimate, out_dir: str | Path | None = None) -> tuple[Path, Path]:
    """``plan-<target>.md`` and ``plan-<target>.png`` in ``out_dir`` (default :func:`default_out_dir`)."""
    folder = Path(out_dir) if out_dir is not None else default_out_dir(est)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"plan-{est.target_ttft_s:g}s" + ("" if est.trial is None else f"-trial{est.trial}")

    md = write_atomic(folder / f"{stem}.md", render_markdown(est))
    png = plot_plan(est, folder / f"{stem}.png")
    return md, png


__all__ = ["default_out_dir", "plot_plan", "render_markdown", "summary_rows", "sweep_rows", "workload_line",
           "write_plan_files"]

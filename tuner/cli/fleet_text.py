"""How ``tuner plan --fleet`` prints a :class:`~tuner.fleet.record.FleetPlan` for a person:
the kinds side by side, what is true of each before any number, the options, the verdict and
where the time went."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tuner.cli.output import console, fit, table

if TYPE_CHECKING:
    from tuner.fleet.record import FleetPlan, KindPlan

#: Flags shown per kind, in this order (ServeConfig fields -> short name).
_FLAGS = (("gpu_memory_utilization", "gmu"), ("max_num_seqs", "seqs"), ("max_num_batched_tokens", "batched"),
          ("max_model_len", "max-len"), ("block_size", "block"), ("kv_cache_dtype", "kv"),
          ("enable_prefix_caching", "prefix-cache"), ("enforce_eager", "eager"))


def _num(v: Any, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.{digits}f}"


def flags_text(cfg: dict[str, Any] | None) -> str:
    if not cfg:
        return "-"
    return " ".join(f"{short} {'on' if cfg[k] is True else 'off' if cfg[k] is False else cfg[k]}"
                    for k, short in _FLAGS if cfg.get(k) is not None)


def kinds_table(plan: FleetPlan, out: Any) -> Any:

    tbl = table()
    # 80 columns hold the nine columns whole: short headers, "any" for a kind one can rent without limit
    for col in ("kind", "GPUs", "$/GPU-h", "vLLM", "layout", "holds/min", "tok/s", "$/Mtok", "band"):
        tbl.add_column(col, justify="left" if col in ("kind", "vLLM", "layout", "band") else "right")
    for k in plan.kinds:
        cap = k.capacity or {}
        tbl.add_row(k.label, "any" if k.kind.get("count") is None else str(k.kind["count"]),
                    f"{k.gpu_hour_cost:.2f}", str(k.kind["vllm_version"]),
                    f"TP{k.tp}" if k.tp else "refused" if k.refusals or k.reason else "-",
                    (">=" if cap.get("bound") == "at_least" else "") + _num(k.per_min(plan.demand_unit))
                    if k.feasible else "-", _num(cap.get("tokens_per_s")),
                    _num(k.cost_per_million_tokens, 3), k.band.text() if k.feasible else "-")
    return fit(tbl, out, labels=(4, 8))


def truth_lines(k: KindPlan) -> list[str]:
    """What is true of the kind: vLLM lines, dtype and quantisation, refusals, ceilings, band."""
    f = k.facts
    lines = [f"{k.label} (compute capability {f['compute_capability']}): " + "; ".join(
        f"vLLM {x.line} {x.engine}/{x.attention}" if x.runs else f"vLLM {x.line}: no wheels" for x in k.lines)]
    quant = ", ".join(f"{m} {v}" for m, v in f["quantization"].items())
    lines.append(f"  bf16 {'yes' if f['bf16'] else 'no (float16)'}; FP8 {f['fp8']}; {quant}")
    for r in k.refusals:
        lines.append(f"  vLLM {r.vllm_version}: {r.message}" if r.check == "wheels" else
                     f"  vLLM {r.vllm_version} refuses {r.tried} ({r.check}): \"{r.message}\"")
    if k.reason and not k.refusals:
        lines.append(f"  no number: {k.reason}")
    if k.instead:
        lines.append(f"  serves instead: {k.instead}")
    if k.feasible:
        lines.append(f"  flags: {flags_text(k.config)}")
        if k.capacity and k.capacity.get("bound") == "at_least":
            lines += [f"  capacity: {n}" for n in k.capacity.get("notes", ()) if "at least" in n or "no more than" in n]
    if k.ceiling is not None and k.capacity:
        c, cap = k.ceiling, k.capacity
        one = f"{k.decode_one_user:,.0f}" if k.decode_one_user else "-"
        lines.append(f"  ceilings at TP{c.tp}: {c.weights_gib:.1f} GiB of weights a GPU; one stream's decode <= "
                     f"{c.decode_tokens_per_s:,.0f} tok/s (predicted {one}); the engine <= {c.compute_tokens_per_s:,.0f} "  # noqa: E501
                     f"tok/s of compute (predicted {cap['tokens_per_s']:,.0f}, "
                     f"{cap['tokens_per_s'] / c.compute_tokens_per_s:.0%})")
    b = k.band
    if k.feasible:  # a kind that serves nothing has no figure to be sure of
        lines.append(f"  band: tokens/s {b.text()}, P95 TTFT {b.text('ttft_p95')}, KV tokens {b.text('kv_tokens')}: "
                     f"{b.basis}")
    return lines


def options_table(plan: FleetPlan, out: Any) -> Any:

    tbl = table()
    for col in ("#", "deployment", "GPUs", "cost/h", "holds/min", "within bands", "why"):
        tbl.add_column(col, justify="left" if col in ("deployment", "why") else "right")
    for i, m in enumerate(plan.options, 1):
        lo, hi = m.cost_range
        rng = f"{_num(lo, 2)}-{_num(hi, 2) if math.isfinite(hi) else 'not held'}"
        tbl.add_row(str(i), m.text(), str(sum(m.gpus.values())), f"{m.cost_per_hour:,.2f}", _num(m.capacity), rng, m.why)  # noqa: E501
    return fit(tbl, out, labels=(1, 6))


def print_plan(plan: FleetPlan) -> None:

    out = console()
    say = lambda text="": out.print(text, markup=False, highlight=False)  # noqa: E731
    fleet = plan.fleet
    say(f"fleet {fleet['name']}: {fleet['model']}, {', '.join(plan.slos)}; demand {plan.demand_per_min:,.0f} "
        f"{plan.demand_unit}/min (+{plan.headroom:.0%} headroom: {plan.need_per_min:,.0f}/min), a conversation = "
        f"{plan.conversation}")
    out.print(kinds_table(plan, out))
    say()
    for k in plan.kinds:
        for line in truth_lines(k):
            say(line)
    say()
    if plan.options:
        out.print(options_table(plan, out))
        best = plan.best
        say(f"cheapest: {best.text()}, {best.cost_per_hour:,.2f} an hour for {best.capacity:,.0f} {plan.demand_unit}"
            f"/min" + (f"; tied under the bands with {', '.join(f'#{i + 1}' for i in plan.ties)}" if plan.ties
                       else "; no runner-up within its band"))
    for note in plan.notes:
        say(f"note: {note}")
    if plan.calibrate_hint:
        say(plan.calibrate_hint)
    spent: dict[str, float] = {}
    for k in plan.kinds:
        for step, s in k.timings.items():
            spent[step] = spent.get(step, 0.0) + s
    # one line whatever the width (the terminal wraps it): the machine's figures, which a transcript masks whole
    out.print(f"took {plan.cpu_s:.1f} s of CPU ({plan.wall_s:.1f} s wall): "
              + ", ".join(f"{step} {s:.1f} s" for step, s in spent.items()), markup=False, highlight=False,
              soft_wrap=True)
    if plan.folder:
        say(f"wrote {plan.folder}/fleet-plan.json and fleet-plan.png (kinds' studies: {plan.storage})")


__all__ = ["flags_text", "kinds_table", "options_table", "print_plan", "truth_lines"]

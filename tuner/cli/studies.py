"""``tuner studies`` (list the studies) and ``tuner studies show NAME`` (one study: its
settings, trial counts and best feasible trial), and the best-trial table that
``tuner search`` prints too."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from tuner.cli.app import app
from tuner.cli.options import OUTPUT_HELP, Output, storage_option
from tuner.cli.output import console, fit, print_json, table
from tuner.cli.storage import readable_storage
from tuner.core.urls import redact, redact_value
from tuner.plan import list_plans
from tuner.search import serve_command
from tuner.search.recipe import front_end_note, output_notes, write_recipe
from tuner.serving.config import Deployment
from tuner.serving.result import bench_fields, describe_errors
from tuner.serving.slo import OBJECTIVES, SloSet, value_text
from tuner.study import (
    best_feasible_trial,
    closest_miss,
    confirmation,
    error_totals,
    gpu_time,
    list_studies,
    load_study_by_name,
    miss_explanation,
    recommendation,
    repeats,
    trial_config,
)
from tuner.study.budget import count_finished, counts_toward_budget, finished_states, free_copies, is_copy
from tuner.study.race import confirmation_rows
from tuner.study.record import StudyRecord, TrialRecord
from tuner.study.recovery import not_measured

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


studies_app = typer.Typer(
    help="List the studies in studies/ (or in --storage), or show one.\n\n"
         "\b\nExamples:\n  tuner studies\n  tuner studies show NAME --output json",
    invoke_without_command=True,
    no_args_is_help=False,
    rich_markup_mode=None,
)
app.add_typer(studies_app, name="studies", short_help="List the studies, or show one.")


def deployment_of(study: optuna.Study) -> Deployment:
    """The deployment ``tuner search`` stamped on the study (the default one when none)."""

    return StudyRecord.from_study(study).deployment or Deployment()


def best_record(best: FrozenTrial, deployment: Deployment) -> dict[str, Any]:
    """What ``tuner search`` and ``tuner studies show`` say of the best feasible trial
    (``--output json``'s ``best``): its throughput, P95 TTFT, load, configuration, failed
    requests and ``vllm serve`` command, and beside them the same measurement under
    ``vllm bench serve``'s names (:func:`tuner.serving.result.bench_fields`: ``total_token_throughput``,
    ``p95_ttft_ms``, ``max_concurrency``, ...)."""

    config = trial_config(best)
    rec = TrialRecord.from_trial(best)
    return {**bench_fields(rec.summary, rec.chosen_load),
        "trial": best.number, "tokens_per_s": rec.tokens_per_s if rec.tokens_per_s is not None else best.value,
        "output_tokens_per_s": rec.output_tokens_per_s,
        "ttft_p95_s": rec.summary.get("ttft_p95_s"), "load": rec.chosen_load,
        # a backend that applies no knob (an endpoint: the server someone else runs) has no command to give
        "config": config.to_dict(), "command": None if rec.run.restarts is False else serve_command(deployment, config),
        "errors": dict(rec.errors or {}), "edge": None if rec.edge is None else rec.edge.to_dict(),
        "goodput_requests_per_s": rec.goodput_requests_per_s, "binding_slo": rec.binding_slo,
        "slos": slo_readings(rec), "output_notes": output_notes(deployment, config),
        "front_end_note": front_end_note(deployment, config, rec.output_tokens_per_s,
                                         f"at {rec.chosen_load}" if rec.chosen_load else "at its load"),
    }


def slo_readings(rec: TrialRecord) -> dict[str, Any]:
    """Each SLO of the trial's study with what the chosen load measured:
    ``{"p99:tpot<=30ms": {"measured_s": 0.027, "margin": 0.1}}`` (margin: 1 - measured/bound)."""

    if not rec.slos and rec.target_ttft_s is None:
        return {}
    slos = SloSet.of((f"p95:ttft<={rec.target_ttft_s}s",) * (rec.target_ttft_s is not None) + tuple(rec.slos))
    return {s.text: {"measured_s": s.measured(rec.summary), "margin": 1 - s.ratio(rec.summary)} for s in slos.slos}


def confirmation_record(conf: Any, best: int) -> dict[str, Any] | None:
    """``--output json``'s ``confirmation``: the repeats that chose trial ``best`` (None
    when the study's confirmation did not choose it, or there is none)."""
    if conf is None or conf.winner != best:
        return None
    return {
        "winner": conf.winner, "mean_tokens_per_s": conf.mean, "band_tokens_per_s": list(conf.band),
        "measurements": len(conf.measurements.get(conf.winner, [])), "leader": conf.leader,
        "tied_with": conf.ties, "equivalent": conf.equivalent, "noise_sd": conf.noise.rel_sd,
        "noise_from": conf.noise.source, "rounds": conf.rounds, "reason": conf.reason,
        "worst_p95_ttft_s": conf.worst_p95_s, "slo_margin": conf.margin,
    }


def _edge_note(edge: dict[str, Any] | None) -> str:
    """' (edge within 5%)', ' (above max-num-seqs x replicas, 256)' or ''."""
    if not edge:
        return ""
    if edge.get("beyond_cap"):
        return f" (above max-num-seqs x replicas, {edge.get('cap')}: queued requests still meet the target)"
    if edge.get("failing_level") is None:
        return " (the most it was offered)"
    return "" if edge.get("located") else f" (next failing load {edge['failing_level']:g}: edge not located)"


def print_best(best: dict[str, Any], target_ttft_s: float | None, conf: dict[str, Any] | None = None,
               objective: str | None = "tokens") -> None:
    """The best trial's table (:func:`best_record`; ``conf``: :func:`confirmation_record`,
    told in the study's ``objective`` unit), the recommendation and the ``vllm serve``
    command, unwrapped so that it can be copied."""

    out = console()
    tbl = table(f"best feasible trial #{best['trial']}")
    tbl.add_column("")
    tbl.add_column("value", justify="right")
    tbl.add_row("throughput (in+out)", f"{best['tokens_per_s']:,.0f} tok/s")
    if best.get("output_tokens_per_s") is not None:
        tbl.add_row("output throughput", f"{best['output_tokens_per_s']:,.0f} tok/s")
    if best.get("ttft_p95_s") is not None:
        target = "" if target_ttft_s is None else f" (target {target_ttft_s:g} s)"
        tbl.add_row("P95 TTFT", f"{best['ttft_p95_s']:.3f} s{target}")
    for text, reading in (best.get("slos") or {}).items():
        if not text.startswith("p95:ttft") and reading.get("measured_s") is not None:
            name, bound = text.split("<=")
            tbl.add_row(name.replace(":", " ").upper(), f"{reading['measured_s'] * 1e3:.1f} ms (bound {bound})")
    if best.get("goodput_requests_per_s") is not None:
        tbl.add_row("goodput", f"{best['goodput_requests_per_s']:.2f} req/s meeting every SLO")
    if best.get("binding_slo"):
        tbl.add_row("binding SLO", best["binding_slo"])
    if best.get("load") is not None:
        tbl.add_row("at load", str(best["load"]) + _edge_note(best.get("edge")))
    if conf:
        for label, text in confirmation_rows(conf["mean_tokens_per_s"], conf["measurements"],
                                             conf["band_tokens_per_s"], conf["tied_with"], conf["noise_sd"],
                                             objective or "tokens"):
            tbl.add_row(label, text)
        if conf.get("worst_p95_ttft_s") is not None and conf.get("slo_margin") is not None:
            tbl.add_row("SLO margin", f"worst P95 TTFT {conf['worst_p95_ttft_s']:.3f} s of {conf['measurements']}, "
                                      f"{conf['slo_margin']:.0%} under the target")
    if best.get("errors"):
        tbl.add_row("failed requests", describe_errors(best["errors"]))
    for key, value in best["config"].items():
        tbl.add_row(key, "default" if value is None else str(value))
    out.print(fit(tbl, out))
    if conf:
        out.print(f"recommendation: {conf['reason']}", markup=False, highlight=False)
    notes = [*(best.get("output_notes") or []), best.get("front_end_note")]
    for note in filter(None, notes):
        out.print(f"note: {note}", markup=False, highlight=False)
    if best["command"] is None:
        out.print("the server was measured as it runs: the space's knobs were not applied to it, so there are no "
                  "flags to recommend", markup=False, highlight=False)
        return
    out.print("vllm serve command:", style="bold")
    print(best["command"])


RECIPE_HELP = ("Write the recommended configuration to FILE as a serve-params file (JSON, what vllm bench sweep "
               "--serve-params reads, or YAML by the extension) and its vllm serve command to FILE with .sh, "
               "with a note where a knob changes model outputs (fp8 KV cache, quantisation), "
               "e.g. --recipe winner.json.")


def write_recipe_of(path: str, best: Any, deployment: Deployment, study: str) -> None:
    """``--recipe FILE`` of ``tuner search`` and ``tuner studies show``: the best trial's
    configuration through :func:`tuner.search.recipe.write_recipe`, and one line saying where."""

    rec = TrialRecord.from_trial(best)
    header = [f"tuner study {study}, trial {best.number}: "
              + (f"{rec.tokens_per_s:,.0f} tok/s" if rec.tokens_per_s is not None else f"value {best.value:g}")
              + (f" at {rec.chosen_load}" if rec.chosen_load else "")
              + (f", P95 TTFT {rec.summary['ttft_p95_s']:.3g} s" if rec.summary.get("ttft_p95_s") is not None
                 else "")]
    paths = write_recipe(path, deployment, trial_config(best), name=f"{study}.trial{best.number}", header=header)
    console(stderr=True).print(f"wrote {paths[0]} (serve-params) and {paths[1]} (vllm serve command)",
                               markup=False, highlight=False)


@studies_app.callback()
def studies_list(
    ctx: typer.Context,
    storage: str | None = storage_option(help="Optuna storage URL to list. Default: every studies/*.db."),
) -> None:
    """List the studies in studies/ (or in --storage), or show one.

    The list has each study's finished and feasible trials and its best
    throughput; tuner studies show NAME has the rest.

    \b
    Examples:
      tuner studies
      tuner studies --storage postgresql://tuner@db/tuner
      tuner studies show NAME --output json
    """
    if ctx.invoked_subcommand is not None:
        return

    readable_storage(storage)
    rows = list_studies(storage)
    out = console()
    if not rows:
        out.print("no studies yet: run tuner search", markup=False, highlight=False)
        return
    tbl = table(f"studies in {redact(storage) if storage else 'studies/'}")
    tbl.add_column("study")
    mixed = any(s.objective not in (None, "tokens") for s in rows)  # then each value says its unit
    for col in ("trials", "feasible", "best" if mixed else "best tok/s", "best trial"):
        tbl.add_column(col, justify="right")
    for s in rows:
        best = "-" if s.best_value is None else value_text(s.best_value, s.objective or "tokens")
        tbl.add_row(s.name, f"{s.finished:,}", f"{s.feasible:,}", best if mixed else best.removesuffix(" tok/s"),
                    "-" if s.best_trial is None else f"#{s.best_trial}")
    out.print(fit(tbl, out))
    out.print("trials: finished trials as --budget counts them; feasible: of those, the ones that met the target "
              "(tuner studies show NAME counts the others: copies, trials that measured nothing)",
              markup=False, highlight=False)


def _settings(study: optuna.Study, counts: dict[str, int]) -> list[tuple[str, str]]:
    """The study's stamp (what ``tuner search`` recorded) as rows a person reads."""

    stamp = StudyRecord.from_study(study)
    dep = stamp.deployment
    rows: list[tuple[str, str]] = []
    if dep is not None:
        quant = f", {dep.quantization}" if dep.quantization else ""
        rows.append(("deployment", f"{dep.gpu_count}x {dep.gpu}, {dep.model}{quant}, vLLM {dep.vllm_version}"))
    for value, label in ((stamp.backend, "backend"), (stamp.space, "search space")):
        if value is not None:
            rows.append((label, str(value)))
    if stamp.target_ttft_s is not None:
        rows.append(("target", f"P95 TTFT <= {float(stamp.target_ttft_s):g} s" + "".join(f", {t}" for t in stamp.slos)))
    if stamp.objective is not None:
        rows.append(("objective", f"{stamp.objective} ({OBJECTIVES[stamp.objective]})"))
    if stamp.load_kind:
        rows.append(("load", str(stamp.load_kind)))
    if stamp.workload_fingerprint:
        rows.append(("workload", f"fingerprint {stamp.workload_fingerprint}"))
    if stamp.sampler:
        rows.append(("sampler", f"{stamp.sampler}, seed {stamp.seed or 0}"))
    rows.append(("trials", _trials_text(budget_counts(study), counts)))
    if held := repeats(study):
        where = f" (study {stamp.confirmation_study})" if stamp.confirmation_study else ""
        rows.append(("confirmation", f"{len(held):,} repeats outside the trials{where}"))
    plans = list_plans(study)
    if plans:
        rows.append(("capacity plans", "; ".join(
            f"trial {p.trial} at {p.target_ttft_s:g} s: {p.max_load:g} {'users' if p.load_kind == 'concurrency' else 'req/s'}"  # noqa: E501
            for p in plans.values())))
    return rows


def budget_counts(study: optuna.Study) -> dict[str, int]:
    """The study's finished trials as ``--budget`` (and ``tuner studies``) counts them, and
    those it does not count: copies of a configuration measured before (free up to
    ``FREE_COPIES``) and trials that measured nothing (interrupted, failed by the environment)."""

    finished = study.get_trials(deepcopy=False, states=finished_states())
    copies = sum(1 for t in finished if counts_toward_budget(t) and is_copy(t))
    return {"budget_trials": count_finished(study), "free_copies": free_copies(copies),
            "not_measured": sum(1 for t in finished if not_measured(t))}


def _trials_text(budget: dict[str, int], states: dict[str, int]) -> str:
    """``4 as --budget counts them (tuner studies lists this number); 44 complete in all:
    40 copies of a configuration measured before (no start, no budget slot)``."""
    text = f"{budget['budget_trials']:,} as --budget counts them (the number tuner studies lists)"
    if states:
        text += "; " + ", ".join(f"{n:,} {state.lower()}" for state, n in states.items()) + " in all"
    left = [f"{budget['free_copies']:,} copies of a configuration measured before (no start, no budget slot)"] * \
        bool(budget["free_copies"])
    left += [f"{budget['not_measured']:,} that measured nothing (interrupted or failed by the environment: "
             "measured again)"] * bool(budget["not_measured"])
    return text + (f"; not counted: {', '.join(left)}" if left else "")


#: ``tuner studies show --help`` (a constant: the docstring would make the command longer than it reads).
SHOW_HELP = """Show one study: its settings, trial counts and best feasible trial.

The best trial comes with its measurements, its configuration and the vllm
serve command that runs it; a study with no feasible trial says which trial
came closest and why it missed.

\b
Examples:
  tuner studies show 1xH100-SXM.qwen2.5-7b.default.10e707e7.ttft2s
  tuner studies show NAME --recipe winner.json
"""


@studies_app.command("show", short_help="One study: its settings, trials and best feasible trial.", help=SHOW_HELP)
def studies_show(
    name: str = typer.Argument(..., metavar="NAME", help="Study name (tuner studies lists them)."),
    storage: str | None = storage_option(help="Optuna storage URL. Default: sqlite:///studies/NAME.db."),
    output: Output = typer.Option(Output.text, "--output", "-o", help=OUTPUT_HELP),
    recipe: str | None = typer.Option(None, "--recipe", metavar="FILE", help=RECIPE_HELP),
) -> None:
    from optuna.trial import TrialState

    readable_storage(storage)
    st = load_study_by_name(name, storage)
    trials = st.get_trials(deepcopy=False)
    counts = {s.name: sum(1 for t in trials if t.state == s) for s in TrialState}
    counts = {k: v for k, v in counts.items() if v}
    best = best_feasible_trial(st)
    recommended = recommendation(st)
    info: dict[str, Any] = {"study": name, "attrs": st.user_attrs, "trials": counts, **budget_counts(st),
                            "errors_total": error_totals(st), "gpu_time": gpu_time(st),
                            "recommendation": None if recommended is None else recommended.to_dict(),
                            "confirmation_study": StudyRecord.from_study(st).confirmation_study,
                            "confirmation_repeats": len(repeats(st))}
    if best is not None:
        info["best"] = best_record(best, deployment_of(st))
        info["best"]["summary"] = dict(TrialRecord.from_trial(best).summary)
        info["confirmation"] = confirmation_record(confirmation(st), best.number)
    else:
        miss = closest_miss(st)
        info["closest_miss"] = None if miss is None else miss_explanation(miss)
        info["closest_miss_errors"] = None if miss is None else TrialRecord.from_trial(miss).errors
    info = redact_value(info)
    if recipe and best is not None:
        write_recipe_of(recipe, best, deployment_of(st), name)
    if output is Output.json:
        print_json(info)
        return
    out = console()
    say = lambda text: out.print(text, markup=False, highlight=False)  # noqa: E731
    say(f"study {name}")
    tbl = table(header=False)
    tbl.add_column("")
    tbl.add_column("")
    for label, value in redact_value(_settings(st, counts)):
        tbl.add_row(label, value)
    out.print(fit(tbl, out, labels=(0, 1)))
    g = info["gpu_time"]
    if g["total_s"]:
        say(f"GPU time: {g['total_s']:,.0f} s held (starts {g['start_s']:,.0f} s, measured loads "
            f"{g['replay_s']:,.0f} s); thrown away {g['wasted_s']:,.0f} s in {g['wasted_trials']:.0f} trials that "
            "measured nothing")
    if info["errors_total"]:
        say(f"failed requests over all trials: {describe_errors(info['errors_total'], limit=8)}")
    if best is None:
        say(f"no feasible trial; {info.get('closest_miss')}")
        if info.get("closest_miss_errors"):
            say(f"its failed requests: {describe_errors(info['closest_miss_errors'], limit=8)}")
        return
    if info["best"]["errors"]:
        say(f"its failed requests: {describe_errors(info['best']['errors'], limit=8)}")
    out.print()
    stamp = StudyRecord.from_study(st)
    print_best(info["best"], stamp.target_ttft_s, info.get("confirmation"), stamp.objective)


__all__ = ["RECIPE_HELP", "best_record", "confirmation_record", "deployment_of", "print_best", "studies_app",
           "write_recipe_of"]

"""``tuner plan``: how much traffic a configuration holds at a P95 TTFT target (a thin
shell over ``tuner.plan(...)``, :func:`tuner.plan.plan_capacity`)."""
from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

import tuner
from tuner.cli._knobs import SET_HELP, build_deployment_config, pins, with_knob_options
from tuner.cli.app import app
from tuner.cli.estimate import build_workload, parse_list
from tuner.cli.fleet import fleet_cmd
from tuner.cli.options import (
    Backend,
    Output,
    api_key_file_option,
    backend_option,
    concurrency_option,
    dtype_option,
    endpoint_option,
    gpu_option,
    gpus_option,
    model_option,
    num_requests_option,
    old_spelling,
    out_option,
    output_option,
    quantization_option,
    rate_option,
    renamed,
    replicas_option,
    seed_option,
    set_option,
    skip_bad_option,
    slo_option,
    storage_option,
    study_option,
    target_ttft_option,
    tensor_parallel_size_option,
    trace_option,
    vllm_cmd_option,
    vllm_version_option,
)
from tuner.cli.output import console, fit, table
from tuner.cli.progress import Runs, warn
from tuner.cli.search import backend_options
from tuner.cli.storage import readable_storage
from tuner.cli.trace import bad_rows_advice
from tuner.core.errors import InputError
from tuner.core.files import write_fault
from tuner.core.knobs import KNOBS
from tuner.plan import Figures, Sweep, summary_rows, sweep_rows, workload_line, write_plan_files
from tuner.plan.workload import find_newest_study
from tuner.serving.config import DEFAULT_VLLM_VERSION
from tuner.serving.demand import parse_fraction
from tuner.serving.slo import parse_slo
from tuner.sim.hardware import get_gpu

#: The options that describe a configuration (a deployment and every knob of tuner.core.knobs).
_KNOBS = ("gpu", "gpus", "model", "quantization", "dtype", "vllm_version", "tensor_parallel_size", "replicas", *(k.name for k in KNOBS))  # noqa: E501


def _config_from_flags(v: dict[str, Any]) -> tuple[Any, Any]:

    tp, replicas = (1 if v[k] is None else v[k] for k in ("tensor_parallel_size", "replicas"))
    return build_deployment_config(
        model=v["model"] or "qwen2.5-7b", gpu=get_gpu(v["gpu"] or "H100-SXM").name, gpus=v["gpus"],
        vllm_version=v["vllm_version"] or DEFAULT_VLLM_VERSION, dtype=v["dtype"] or "auto",
        quantization=v["quantization"], tp=tp, replicas=replicas,
        knobs={k.name: v[k.name] for k in KNOBS if v[k.name] is not None},
    )


#: ``tuner plan --help`` (a constant: the docstring would make the command longer than it reads).
PLAN_HELP = """How much traffic does this configuration hold at a P95 TTFT target?

Sweeps the load on the study's best feasible configuration (or --trial, or a
configuration given with tuner estimate's flags), finds the largest load meeting the
target by monotone interpolation, verifies it with a run there and runs between the
last load that held and the first that broke until the two are within 5 % (one
user), as the search locates a trial's edge, and reports max concurrency,
requests/s, tokens/s, conversations/min, replicas for --demand, cost. On a study's
trial a note sets the plan beside the search's figure for it.
It replays the requests the study searched on (the file it read, or more requests
of its synthetic mix), checked by fingerprint; --trace FILE replays another
workload on purpose. The plan records which workload it replayed.

Exit codes: 0 ok, 2 bad input or no study, 3 no feasible trial / even the lowest load misses.

\b
Examples:
  tuner plan --target-ttft 5s
  tuner plan --target-ttft 5s --demand 1200/min --gpu-hour-cost 1.2
  tuner plan --fleet mixed-room --demand 3000/min --slo 'p95:ttft<=5s'
  tuner plan --target-ttft 5s --gpu V100-32GB-SXM2 --gpus 8 \\
      --model llama-2-7b --dtype float16 --tensor-parallel-size 8 \\
      --max-num-seqs 128"""

# The options of tuner plan, as it explains them (shared flags are spelt in tuner.cli.options).
TargetTtftOpt = target_ttft_option("P95 time-to-first-token target: 5s, 500ms or 5 (seconds). Default: the "
                                   "study's target (5s for a config given here).")
SloOpt = slo_option("A service level each load must meet besides P95 TTFT, repeatable: p99:tpot<=30ms, "
                    "p95:itl<=50ms, p90:e2el<=20s (p95:ttft<=X is --target-ttft X). Default: the study's. The sweep "
                    "names the one that limits each load.")
StudyOpt = study_option("Study to plan from (see tuner studies). Default: the newest in studies/ (or in --storage).")
TrialOpt = Annotated[int | None, typer.Option("--trial", help="Trial number to plan. Default: the study's best "
                                              "feasible trial.")]
GpuOpt = gpu_option("Plan a configuration given here instead of a study: GPU from the catalog (as in tuner "
                    "estimate; default H100-SXM).")
GpusOpt = gpus_option("GPUs in the machine: a count (8) or device ids (0-7). Default: tp x replicas.")
ModelOpt = model_option("Model preset or folder with config.json (default qwen2.5-7b).")
QuantizationOpt = quantization_option("awq, gptq, fp8, ... or none.")
DtypeOpt = dtype_option("auto, float16/half, bfloat16 (V100/T4 need float16).")
VllmVersionOpt = vllm_version_option("vLLM release whose behaviour to follow.")
TensorParallelSizeOpt = tensor_parallel_size_option("GPUs per replica (must divide the heads).")
ReplicasOpt = replicas_option("Independent engines of the configuration (data parallel).")
SetOpt = set_option(SET_HELP + " Describes a configuration, as the knob flags do (not with --study/--trial).")
SkipBadOpt = skip_bad_option()
NumRequestsOpt = num_requests_option(
    "Requests per run: the first N rows of --trace or of the study's file (a subset, noted in the plan), or N of "
    "the synthetic mix (default max(study's, 1000): a larger sample of the same distribution, doubled up to 16,000 "
    "while the target holds at half of it).")
EndpointOpt = endpoint_option("Base URL(s) of a running server, comma-separated (endpoint backend).")
ApiKeyFileOpt = api_key_file_option("endpoint backend: a file holding the server's API key (sent as a bearer token; "
                                    "never stored or printed). Default: $OPENAI_API_KEY, else $VLLM_API_KEY.")
TimeScaleOpt = Annotated[float | None, typer.Option("--time-scale", help="Multiply measured times by this (a server "
                                                    "running N times faster than real time). Default: sim-serve's "
                                                    "--speed.")]
ConcurrencyOpt = concurrency_option("Closed-loop users to sweep, comma-separated; all are run. Default: the "
                                    "article's 5,10,20,50,80,120,160, stopping at the first level over the target, "
                                    "or extended x1.5 until the target breaks.")
RateOpt = rate_option("Sweep open-loop Poisson rates (req/s) instead, comma-separated, e.g. 2,4,8,16 (as tuner "
                      "estimate --rate).")
TokensPerConversationOpt = Annotated[float | None, typer.Option(
    "--tokens-per-conversation", help="Tokens (in+out) of one conversation, as the article's 300. Default: requests "
    "per conversation from the trace's session ids, else the workload's mean tokens per request.")]
DemandOpt = Annotated[str | None, typer.Option("--demand", help="Traffic to serve: 1200/min, 20/s, 72000/h "
                                               "conversations (write 20req/s for requests); gives the replicas "
                                               "needed.")]
HeadroomOpt = Annotated[str, typer.Option("--headroom", help="Spare capacity on top of --demand: 20% provisions "
                                          "1.2x the demand.")]
GpuHourCostOpt = Annotated[float | None, typer.Option("--gpu-hour-cost", help="Price of one GPU-hour; gives cost "
                                                      "per hour and per million tokens.")]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="Repeat the sweep with other seeds; figures get min-max "
                                         "ranges.")]
SeedOpt = seed_option("Seed of the workload sample and open-loop arrivals.")
OutputOpt = output_option()
OutOpt = out_option("Folder for plan-<target>.md and .png. Default: studies/<study>/ (studies/plans/ for a config "
                    "given here).")
FilesOpt = Annotated[bool, typer.Option("--files/--no-files", help="Write the Markdown and PNG report.")]
StoreOpt = Annotated[bool, typer.Option("--store/--no-store", help="Store the plan in the study (load_plan reads it).")]
FleetOpt = Annotated[str | None, typer.Option(
    "--fleet", metavar="FLEET", help="Plan across GPU kinds instead: a fleet file (or a shipped one: "
    "article-004-room, article-000-box, mixed-room) of kinds, counts, prices and vLLM versions; with --demand, the "
    "cheapest deployment within it (docs/fleet.md).")]


@app.command("plan", short_help="How much traffic a configuration holds at a P95 TTFT target.", help=PLAN_HELP)
@with_knob_options()
def plan_cmd(
    target_ttft: TargetTtftOpt = None, slo: SloOpt = None, study: StudyOpt = None,
    storage: str = storage_option(help="Optuna storage URL of the study. Default: sqlite:///studies/<study>.db."),
    trial: TrialOpt = None, gpu: GpuOpt = None, gpus: GpusOpt = None, model: ModelOpt = None,
    quantization: QuantizationOpt = None, dtype: DtypeOpt = None, vllm_version: VllmVersionOpt = None,
    tensor_parallel_size: TensorParallelSizeOpt = None, tp: int = old_spelling("--tp"), replicas: ReplicasOpt = None,
    set_: SetOpt = None,
    trace: str = trace_option(help="Request log to replay instead of the study's workload (any format tuner "
                                   "trace reads), on purpose: when it is not the study's, plan says so in "
                                   "one warning line and replays it. Default: the requests the study "
                                   "searched on (the file it read, checked by fingerprint: plan refuses, "
                                   "exit 2, when that file now holds other requests), or its synthetic mix; "
                                   "the built-in 40/40/20 mix of article 004 for a configuration given here."),
    skip_bad: SkipBadOpt = False, num_requests: NumRequestsOpt = None,
    backend: Backend = backend_option(), vllm_cmd: str = vllm_cmd_option(), endpoint: EndpointOpt = None,
    api_key_file: ApiKeyFileOpt = None, time_scale: TimeScaleOpt = None,
    concurrency: ConcurrencyOpt = None, rate: RateOpt = None, rates: str = old_spelling("--rates"),
    tokens_per_conversation: TokensPerConversationOpt = None, demand: DemandOpt = None, headroom: HeadroomOpt = "20%",
    gpu_hour_cost: GpuHourCostOpt = None, repeats: RepeatsOpt = 1, seed: SeedOpt = 0,
    output: OutputOpt = Output.text, out: OutOpt = None, files: FilesOpt = True, store: StoreOpt = True,
    fleet: FleetOpt = None,
    *,
    knob_flags: dict[str, Any],  # the knobs' options (with_knob_options)
) -> None:
    if fleet is not None:  # across GPU kinds (tuner.cli.fleet)
        return fleet_cmd(fleet, dict(locals()), knob_flags)

    backend, output = backend.value, output.value  # type: ignore[assignment]
    readable_storage(storage)
    tensor_parallel_size = renamed(tensor_parallel_size, tp, "--tp")
    deployment, config = _configuration(dict(locals()), knob_flags)
    sweep = Sweep(levels=parse_list(concurrency, int, "--concurrency") or None,
                  rates=parse_list(renamed(rate, rates, "--rates"), float, "--rate") or None, repeats=repeats, seed=seed,  # noqa: E501
                  requests=num_requests, time_scale=time_scale)
    figures = Figures(tokens_per_conversation=tokens_per_conversation, demand=demand,
                      headroom=parse_fraction(headroom), gpu_hour_cost=gpu_hour_cost)
    workload = build_workload(trace, None, None, num_requests, skip_bad=skip_bad) if trace else None
    options = backend_options(backend, vllm_cmd=vllm_cmd, endpoint=endpoint, api_key_file=api_key_file)
    # a repeat runs its levels (the default ones stop one past the target) and verifies; extensions and
    # the runs between the last load that held and the first that broke grow the total. The study's own
    # file is read whole (--skip-bad is for --trace).
    with bad_rows_advice(None), Runs(repeats * (len(sweep.grid) + 1)) as progress:
        est = tuner.plan(target_ttft, study=study, storage=storage, trial=trial, config=config, deployment=deployment,
                         requests=workload, backend=backend, backend_options=options, sweep=sweep, figures=figures,
                         store=store, observer=progress, slo=list(slo) if slo else None)
    paths = _write_files(est, out) if files else None
    if output == "json":
        print(json.dumps(dict(est.to_dict(), files=None if paths is None else [str(p) for p in paths]), indent=2))
        return
    _print(est, paths)


def _configuration(values: dict[str, Any], knob_flags: dict[str, Any]) -> tuple[Any, Any]:
    """The deployment and serve config that the configuration flags describe (``--gpu``, ``--model``,
    the knobs, ``--set``), or ``(None, None)`` where none is given: the study's trial is planned."""
    knobs, _ = pins(knob_flags, values["set_"])
    values = {**values, **{k.name: knobs.get(k.name) for k in KNOBS}}
    given = [k for k in _KNOBS if values[k] is not None]
    if not given:
        return None, None
    flag = f"--{given[0].replace('_', '-')}"
    if values["study"] or values["trial"] is not None:
        raise InputError(f"{flag} describes a configuration; --study/--trial pick one from a study",
                         hint="give one or the other")
    if (name := _a_study(values["storage"])) is not None:
        warn(f"{flag} describes a configuration given here (vLLM's defaults for every knob not given), not the best "
             f"of study {name}: to plan that, give --study {name} without {flag}")
    return _config_from_flags(values)


def _a_study(storage: str | None) -> str | None:
    """The newest study plan would have picked without configuration flags, if any."""
    try:
        return find_newest_study(storage=storage)[0]
    except Exception:  # noqa: BLE001 - no study, or one that cannot be read: nothing to point at
        return None


def _write_files(est: Any, out: str | None) -> Any:
    """The plan's files; beside a read-only study (its default folder), none: the plan is
    still printed, and one warning says where to write them (``--out``)."""
    import errno
    from pathlib import Path

    try:
        return write_plan_files(est, out)
    except OSError as err:
        if out is not None or err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise write_fault(Path(err.filename or out or "."), err) from None
        print(f"tuner: warning: {err.filename or 'the study folder'} is read-only: the plan's files were not "
              "written (give --out DIR)", file=sys.stderr)
        return None


def _print(est: Any, paths: Any) -> None:

    out = console()
    say = lambda text: out.print(text, markup=False, highlight=False)  # noqa: E731
    where = f"study {est.study} trial {est.trial}" if est.study else "configuration given on the command line"
    say(f"load sweep of {where}, backend {est.backend}:")
    axis = "users" if est.load_kind == "concurrency" else "req/s in"
    sweep = table()
    slos = bool(est.slos)  # more than P95 TTFT: goodput and the SLO that limits each load
    # with SLOs, goodput and the limiting SLO take the place of output tokens/s (the summary keeps it)
    for col in (axis, "TTFT avg", "TTFT p95", "E2E avg", "tok/s", *(() if slos else ("out tok/s",)), "req/s",
                *(("goodput", "limit") if slos else ()), "run"):
        sweep.add_column(col, justify="left" if col in ("run", "limit") else "right", no_wrap=col == "limit")
    for p in sweep_rows(est):
        style = "green" if p.ttft_p95_s <= est.target_ttft_s else "red"
        limit = (f"[{'green' if p.meets(est.target_ttft_s) else 'red'}]{parse_slo(p.binding_slo).label()} "
                 f"{p.slo_ratio:.0%}[/]",) if slos and p.binding_slo else ("",) if slos else ()
        sweep.add_row(f"{p.level:.4g}", f"{p.ttft_mean_s:.2f} s", f"[{style}]{p.ttft_p95_s:.2f} s[/]",
                      f"{p.e2e_mean_s:.1f} s", f"{p.tokens_per_s:,.0f}",
                      *(() if slos else (f"{p.output_tokens_per_s:,.0f}",)), f"{p.requests_per_s:.2f}", *((f"{p.goodput_requests_per_s:.2f}",) + limit if slos else ()),  # noqa: E501
                      p.role)
    out.print(fit(sweep, out, labels=()))
    say(f"workload: {workload_line(est.workload)}")
    out.print()
    summary = table("capacity", header=False)
    summary.add_column("")
    summary.add_column("", justify="right")
    for label, value in summary_rows(est):
        summary.add_row(label, value)
    out.print(fit(summary, out))
    for note in est.notes:
        say(f"note: {note}")
    if paths:
        say(f"wrote {paths[0]} and {paths[1]}")

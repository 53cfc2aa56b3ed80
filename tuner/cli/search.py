"""``tuner search`` (run or resume a study) and ``tuner studies`` (list / show them)."""
from __future__ import annotations

import json
from typing import Any

import typer

from tuner.cli._knobs import SET_HELP, parse_gpus, pins, quantization_flag, with_knob_options
from tuner.cli.app import app
from tuner.cli.options import (
    Backend,
    Output,
    Sampler,
    backend_option,
    storage_option,
    trace_option,
    vllm_cmd_option,
)
from tuner.cli.output import console
from tuner.cli.progress import Bar
from tuner.cli.studies import RECIPE_HELP, best_record, confirmation_record, print_best, write_recipe_of
from tuner.cli.trace import bad_rows_advice
from tuner.core.errors import InputError, NoFeasibleConfig, WindowClosed
from tuner.core.units import parse_seconds
from tuner.core.urls import read_api_key, redact, redact_value
from tuner.runtime.interrupts import alarm
from tuner.search import SearchSettings
from tuner.search.workflow import search as run_search
from tuner.serving.result import describe_errors
from tuner.serving.slo import SloSet
from tuner.sim.hardware import get_gpu
from tuner.study import closest_miss, error_totals, miss_explanation, recommendation
from tuner.study.record import TrialRecord


def deployment_changes(*, model: str | None = None, quantization: str | None = None,
                       gpu: str | None = None, gpus: str | None = None) -> dict[str, Any]:
    """The Deployment fields the command line overrides (--model, --quantization, --gpu, --gpus)."""
    changes: dict[str, Any] = {}
    if model:
        changes["model"] = model
    if quantization:
        changes["quantization"] = quantization_flag(quantization)
    if gpu:
        changes["gpu"] = get_gpu(gpu).name
    if gpus:
        changes["gpu_count"], changes["gpu_ids"] = parse_gpus(gpus)
    return changes


def backend_options(backend: str, *, vllm_cmd: str | None = None,
                    endpoint: str | None = None, startup_timeout: str | None = None,
                    request_timeout: str | None = None, api_key_file: str | None = None) -> dict[str, Any]:
    """Constructor options of the chosen backend (``tuner search``, ``plan``, ``nightly``):
    ``--startup-timeout`` (vllm) and ``--request-timeout`` (vllm, endpoint) as durations;
    the endpoint's API key from ``--api-key-file`` or the environment
    (:func:`tuner.core.urls.read_api_key`: ``OPENAI_API_KEY``, ``VLLM_API_KEY``)."""

    if api_key_file and backend != "endpoint":
        raise InputError(f"--api-key-file is for --backend endpoint, not {backend}",
                         hint="tuner starts the vllm and sim servers itself; they need no key")
    options: dict[str, Any] = {}
    if request_timeout and backend in ("vllm", "endpoint"):
        options["timeout_s"] = parse_seconds(request_timeout, what="--request-timeout")
    if backend == "vllm":
        if vllm_cmd:
            options["vllm_cmd"] = vllm_cmd
        if startup_timeout:
            options["startup_timeout_s"] = parse_seconds(startup_timeout, what="--startup-timeout")
    elif backend == "endpoint":
        if not endpoint:
            raise InputError("--backend endpoint needs --endpoint URL", hint="e.g. --endpoint http://127.0.0.1:8000")
        options["urls"] = [u.strip() for u in endpoint.split(",") if u.strip()]
        key = read_api_key(api_key_file)
        if key is not None:
            options["api_key"] = key
    return options


_PIN = " Pinned: fixed in the space, not searched (a study of its own)."

#: How long past --timeout the hard stop waits for the cooperative one (a hung start or
#: replay is then interrupted wherever it is).
TIMEOUT_GRACE_S = 10.0


#: ``tuner search --help`` (the command's docstring would make it 25 lines longer than it reads).
SEARCH_HELP = """Find the vLLM configuration with the most token throughput while P95 TTFT meets the target.

Each trial samples a configuration from the search space, pre-checks it with the simulator's memory planner (a configuration vLLM would refuse costs nothing), starts it, and searches the highest load whose P95 TTFT meets the target; the token throughput there is the trial's score.

With --backend vllm, the simulator also predicts each configuration before it starts (--no-predict turns this off): the load search starts where it predicts the edge of the target, and a configuration predicted far below the best trial, or the same as a weaker one, is recorded as PRUNED without a launch. Its predictions are scaled by how far the measured trials were from them.

Every trial is stored in an Optuna study (default sqlite:///studies/NAME.db); running the same command again resumes it and tops it up to --budget finished trials.

A stop signal (Ctrl-C, SIGTERM from timeout/systemd/cron, SIGHUP) stops the trial in progress and its servers, and exits 130/143/129. --timeout starts a trial only when the study's longest trial fits in the time left, and --timeout stops one still running at the limit the same way; the run then prints the best so far, as a finished run does, and exits 124 while trials of the budget (or the winner's confirmation) are left, 0 once none is. A trial stopped either way, and one failed by the machine (a taken port, a full disk, a flag the server rejects), is not counted and is measured again when the study resumes.

Exit codes: 0 a feasible configuration was found, 2 bad input or a fault of the environment (the message says what and where), 3 no configuration met the target (the closest miss is explained), 5 the --endpoint server cannot be talked to (refused, reset, no answer in time, implausible streams; the URL and the cause are named), 124 --timeout ended the run before the budget was used (a trial starts only when the study's longest trial fits in the time left; the same command goes on), 130/143/129 interrupted.

\b
Examples:
  tuner search --budget 40
  tuner search --budget 40 --gpu H200 --model qwen2.5-14b --target-ttft 1s
  tuner search --budget 40 --slo p95:ttft<=2s --slo p99:tpot<=30ms
  tuner search --budget 40 --trace logs.jsonl --storage postgresql://db/tuner
  tuner search --backend vllm --model /models/qwen2.5-7b --gpus 0-7
  tuner search --budget 20 --max-num-seqs 256 --set kv_cache_dtype=auto
  tuner search --budget 20 --gpus 8 --tensor-parallel-size 2
  tuner search --budget 40 --recipe winner.json
"""  # noqa: E501


@app.command("search", short_help="Find the vLLM flags with the most tokens/s at a P95 TTFT target.",
             help=SEARCH_HELP)
@with_knob_options(_PIN)
def search_cmd(
    space: str = typer.Option("default", "--space", help="Search space: a shipped name (default, article-000-v100-16gb, article-004-8xv100-32gb) or a YAML file."),  # noqa: E501
    backend: Backend = backend_option(),
    model: str | None = typer.Option(None, "--model", help="Model: a preset (qwen2.5-7b, ...) or a local folder with config.json. Default: the space's."),  # noqa: E501
    quantization: str | None = typer.Option(None, "--quantization", "-q", help="Weight quantization of --model (awq, gptq, fp8, ...). Default: the space's."),  # noqa: E501
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type from the catalog (H100-SXM, V100-32GB-SXM2, ...), as in tuner estimate."),  # noqa: E501
    gpus: str | None = typer.Option(None, "--gpus", help="GPUs to use: a count (8) or device ids for the vLLM backend (0-7, 0,2,4)."),  # noqa: E501
    trace: str | None = trace_option(help="Request log to optimise for (any format tuner trace reads). "
                                          "Default: the built-in synthetic mix."),
    target_ttft: str | None = typer.Option(None, "--target-ttft", help="P95 time-to-first-token target: 5s, 500ms or 5 (seconds). Default: the space's."),  # noqa: E501
    slo: list[str] | None = typer.Option(None, "--slo", help="A service level every chosen load must meet, repeatable: p95:ttft<=2s, p99:tpot<=30ms, p95:itl<=50ms, p90:e2el<=20s (percentiles p50/p90/p95/p99). --target-ttft X is --slo p95:ttft<=X; P95 TTFT is always one of them (default: the space's). Each is an Optuna constraint; another set is another study."),  # noqa: E501
    objective: str = typer.Option("tokens", "--objective", help="What a trial scores at its edge: tokens (tokens/s, prompt + output) or goodput (requests/s meeting every SLO, as vllm bench serve --goodput counts them); a goodput study is a study of its own."),  # noqa: E501
    load: str | None = typer.Option(None, "--load", help="How the goodput search offers the traffic: concurrency (closed loop), rate (Poisson) or trace (logged times, compressed)."),  # noqa: E501
    budget: int = typer.Option(40, "--budget", help="Finished trials the study should hold; re-running tops an existing study up to this number."),  # noqa: E501
    timeout: str | None = typer.Option(None, "--timeout", help="Wall time of this run: 2h, 45m or 3600 (seconds). No trial starts that would not finish in time; the best so far is printed, and the exit is 124 while the budget is not used (the same command goes on)."),  # noqa: E501
    storage: str | None = storage_option(),
    study: str | None = typer.Option(None, "--study", help="Study name. Default: deployment label + space + workload fingerprint, so the same job resumes the same study."),  # noqa: E501
    sampler: Sampler = typer.Option(Sampler.tpe, "--sampler", case_sensitive=False, help="tpe (with the TTFT constraint, default), gp (needs torch), random, or grid (the space's discretised grid)."),  # noqa: E501
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler and of the load's randomness."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text: a table and the vllm serve command; json: one JSON object on stdout, for scripts."),  # noqa: E501
    warm_start: str | None = typer.Option(None, "--warm-start", help="sim: run a simulator study first and try its best few configurations first (for real backends)."),  # noqa: E501
    vllm_cmd: str | None = vllm_cmd_option(),
    endpoint: str | None = typer.Option(None, "--endpoint", help="Base URL of a running OpenAI-compatible server (endpoint backend); several, comma-separated, are replicas."),  # noqa: E501
    api_key_file: str | None = typer.Option(None, "--api-key-file", help="endpoint backend: a file holding the server's API key, sent as 'Authorization: Bearer KEY'. Default: $OPENAI_API_KEY, else $VLLM_API_KEY. The key is never stored, logged or printed."),  # noqa: E501
    predict: bool = typer.Option(True, "--predict/--no-predict", help="vllm backend: let the simulator guide each trial (start the load search at its predicted load, skip configurations it predicts under 80% of the best, or the same as a weaker trial). Pruned trials store the prediction."),  # noqa: E501
    startup_timeout: str | None = typer.Option(None, "--startup-timeout", help="vllm backend: a server not healthy after this long (30m, 900s) is recorded as a start timeout. Default 30m."),  # noqa: E501
    request_timeout: str | None = typer.Option(None, "--request-timeout", help="vllm/endpoint backends: one request taking longer is an error of kind timeout. Default 10m."),  # noqa: E501
    confirm: int = typer.Option(2, "--confirm", min=0, max=20, help="Once the budget is spent, measure the configurations within the noise band of the best this many more times each (fresh start, the requests in another order) and recommend on the repeats; 0: recommend the single best measurement."),  # noqa: E501
    confirm_max: int = typer.Option(5, "--confirm-max", min=0, max=20, help="Go on confirming, up to this many repeats each, while a configuration that differs from the leader in a knob that changes speed (KV dtype, batched-token budget, layout, prefix caching) is still within the noise band of it (1-3 % run-to-run noise needs about 5 repeats to tell a 2.5 % gap)."),  # noqa: E501
    feasibility: float = typer.Option(0.9, "--feasibility", help="A configuration in the confirmation race whose P95 TTFT at one user per replica lies near the target stays in only while the probability that it meets the target (from its repeats and a 10 % per-start TTFT noise prior on real vLLM) is above this; when none holds, the next-best are raced, and with none left the search exits 3 naming the closest (worst P95 of its repeats vs the target)."),  # noqa: E501
    edge_tolerance: float = typer.Option(0.05, "--edge-tolerance", min=0.001, max=0.5, help="A trial's edge (the most load meeting the target) is located when a passing and a failing load are this share apart (closed loop: at least one user)."),  # noqa: E501
    start_refused: bool = typer.Option(False, "--start-refused", help="Start a configuration the memory planner predicts vLLM will refuse for memory (KV cache too small for one max-model-len request, or none at all) anyway: the trial records the prediction's margin and the planner's measured error beside what the start did (vLLM's refusal in its own words, or the KV cache it got). Default: such a configuration is recorded as refused without a start."),  # noqa: E501
    resume_anyway: bool = typer.Option(False, "--resume-anyway", help="Resume the study even though its search space was another (a study is refused when the same name comes with a space that parses differently: its best trial may lie outside the new one)."),  # noqa: E501
    tensor_parallel_size: int | None = typer.Option(None, "--tensor-parallel-size", help="Keep only the space's layouts with this tensor-parallel size (GPUs per replica); --set tensor_parallel_size=N is the same. A study of its own."),  # noqa: E501
    replicas: int | None = typer.Option(None, "--replicas", help="Keep only the space's layouts with this many replicas (independent engines); --set replicas=N is the same. A study of its own."),  # noqa: E501
    set_: list[str] | None = typer.Option(None, "--set", metavar="KNOB=VALUE", help=SET_HELP + _PIN),
    recipe: str | None = typer.Option(None, "--recipe", metavar="FILE", help=RECIPE_HELP),
    kill_stale: bool = typer.Option(False, "--kill-stale", help="Kept for old scripts: servers a dead tuner run left on this host (tuner's marker, owner gone) are always stopped now, never others' processes; one that will not stop makes the run refuse to start (exit 2)."),  # noqa: E501
    *,
    knob_flags: dict[str, Any],  # the knobs' options (with_knob_options)
) -> None:

    backend, sampler, output = backend.value, sampler.value, output.value  # type: ignore[assignment]
    if warm_start not in (None, "sim"):
        raise InputError(f"--warm-start {warm_start!r} is unknown", hint="use --warm-start sim")
    timeout_s = parse_seconds(timeout, what="--timeout") if timeout is not None else None
    settings = SearchSettings(budget=budget, timeout_s=timeout_s, sampler=sampler, seed=seed, confirm=confirm,
                              confirm_max=confirm_max, edge_tolerance=edge_tolerance, kill_stale=kill_stale,
                              feasibility=feasibility, start_refused=start_refused,
                              objective=objective, resume_anyway=resume_anyway)
    options = backend_options(backend, vllm_cmd=vllm_cmd, endpoint=endpoint, startup_timeout=startup_timeout,
                              request_timeout=request_timeout, api_key_file=api_key_file)
    service = SloSet.parse(slo or (), target_ttft)  # --slo and --target-ttft, read once here
    pinned, where = pins(knob_flags, set_, layout={"tensor_parallel_size": tensor_parallel_size, "replicas": replicas})
    # --slo replaces the space's service levels; --target-ttft alone changes its target only
    workload = {"trace": trace, "load": load, "target_ttft_s": None if slo or service is None else service.target_ttft_s}  # noqa: E501
    alarm(None if timeout_s is None else timeout_s + TIMEOUT_GRACE_S)  # the hard stop behind --timeout
    with Bar("trials", budget, best=True, objective=objective) as progress, \
            bad_rows_advice(trace):
        outcome = run_search(
            space, deployment=deployment_changes(model=model, quantization=quantization, gpu=gpu, gpus=gpus),
            workload=workload, slo=service if slo else None, backend=backend, backend_options=options,
            study=study, storage=storage, settings=settings, predict=predict, warm_start=warm_start == "sim",
            observer=progress, pin=pinned, pin_where=where)
    alarm(None)
    report = _report(outcome, objective)
    if recipe and outcome.best is not None:
        write_recipe_of(recipe, outcome.best, outcome.deployment, outcome.name)
    if output == "json":
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    _raise_for_end(outcome, report, budget, confirm, timeout_s)


def _report(outcome: Any, objective: str) -> dict[str, Any]:
    """What ``tuner search`` says of a run: its study, trials, the best (or the closest miss)."""

    dep, best = outcome.deployment, outcome.best
    recommended = recommendation(outcome.study)
    report: dict[str, Any] = {
        "study": outcome.name, "storage": redact(outcome.storage or f"sqlite:///studies/{outcome.name}.db"),
        "finished_trials": outcome.finished, "new_trials": outcome.new_trials, "copies": outcome.copies,
        "wall_s": round(outcome.wall_s, 2), "gpu_s": round(outcome.gpu_s, 1),
        "target_ttft_s": outcome.target_ttft_s, "slos": list(outcome.slos), "objective": objective,
        "backend": outcome.backend,
        "pruned_trials": sum(1 for t in outcome.study.trials if t.state.name == "PRUNED"),
        "deployment": dep.to_dict(), "best": None, "notes": outcome.notes, "timed_out": outcome.timed_out,
        "errors_total": error_totals(outcome.study),
        "recommendation": None if recommended is None else recommended.to_dict(),
    }
    if best is not None:
        report["best"] = best_record(best, dep)
        conf = confirmation_record(outcome.confirmation, best.number)
        if conf is not None:
            report["confirmation"] = conf
    else:
        miss = closest_miss(outcome.study)
        report["closest_miss"] = None if miss is None else miss_explanation(miss)
        report["closest_miss_errors"] = None if miss is None else TrialRecord.from_trial(miss).errors
    return redact_value(report)


def _raise_for_end(outcome: Any, report: dict[str, Any], budget: int, confirm: int, timeout_s: float | None) -> None:
    """The run's exit where it is not 0: --timeout left trials or the confirmation (124), or
    no configuration met the service levels (3)."""
    best = outcome.best
    if outcome.timed_out and outcome.finished < budget:
        raise WindowClosed(f"--timeout {timeout_s:g} s reached with {outcome.finished} of {budget} trials finished"
                           + ("" if best is None else f" (best so far: trial {best.number})")
                           + "; nothing is lost: run the same command again to go on")
    if outcome.timed_out and outcome.confirmation is None and confirm > 0 and best is not None:
        raise WindowClosed(f"--timeout {timeout_s:g} s reached with the budget's {budget} trials finished and the "
                           f"winner not confirmed yet (best so far: trial {best.number}; a repeat would not fit "
                           "in the time left); nothing is lost: run the same command again to confirm it")
    if best is None:
        if outcome.confirmation is not None and not getattr(outcome.confirmation, "held", True):
            raise NoFeasibleConfig(f"no configuration held {outcome.slo_text()} on its repeats: "
                                   f"{outcome.confirmation.reason}; widen the space or relax the target")
        raise NoFeasibleConfig(
            f"no configuration met {outcome.slo_text()} in {outcome.finished} trials; "
            + (report.get("closest_miss") or "no trial ran"),
        )


def _print_report(report: dict[str, Any]) -> None:

    out = console()
    say = lambda text: out.print(text, markup=False, highlight=False)  # noqa: E731
    say(f"study {report['study']} ({report['storage']}): {report['finished_trials']} finished trials, "
        f"{report['new_trials']} new in {report['wall_s']:.1f} s"
        + (f" ({report['copies']} of them {'a copy' if report['copies'] == 1 else 'copies'} of a configuration "
           "measured before: no start, no budget slot)" if report.get("copies") else "")
        + (f", {report['pruned_trials']} pruned by the simulator's prediction" if report.get("pruned_trials") else ""))
    for note in report.get("notes") or []:
        say(f"note: {note}")
    if report.get("errors_total"):
        say(f"failed requests over the study's trials: {describe_errors(report['errors_total'])} "
            "(tuner studies show NAME has them per trial)")
    if report["best"] is not None:
        print_best(report["best"], report["target_ttft_s"], report.get("confirmation"), report["objective"])

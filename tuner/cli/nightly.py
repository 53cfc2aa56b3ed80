"""``tuner nightly``: resume the deployment's standing study on the latest traffic and
flag throughput regressions (exit 4). The work is :func:`tuner.ops.nightly.run_nightly`."""
from __future__ import annotations

import typer

from tuner.cli.app import app
from tuner.cli.options import (
    Backend,
    Output,
    backend_option,
    old_spelling,
    renamed,
    storage_option,
    trace_option,
    vllm_cmd_option,
)
from tuner.cli.progress import Bar
from tuner.cli.search import backend_options, deployment_changes
from tuner.cli.trace import bad_rows_advice
from tuner.core.errors import InputError
from tuner.core.units import parse_seconds
from tuner.core.urls import redact
from tuner.ops.nightly import (
    RegressionDetected,
    latest_window,
    parse_threshold,
    run_nightly,
)
from tuner.search import prepare

#: ``tuner nightly --help`` (a constant: the docstring would make the command longer than it reads).
NIGHTLY_HELP = """Tune tonight on the latest traffic, compare with earlier nights, exit 4 on a regression.

Resumes one standing study per deployment (not per workload), runs last night's best configuration again, then --trials new ones within --timeout. Tonight's best is compared with the latest earlier night whose workload has the same shape (mean prompt and output lengths, prefix reuse); a changed workload is reported, never called a regression. Writes nightly.md/.html/.json and the study's report.html.

A second nightly run on the same study exits at once. Exit codes: 0 no regression, 2 bad input or study busy, 4 regression beyond --threshold.

\b
Examples:
  tuner nightly --trace /var/log/llm/requests.jsonl --window 24h
  tuner nightly --trials 10 --timeout 2h --threshold 5%
"""  # noqa: E501


@app.command("nightly", short_help="Tune on the latest traffic; exit 4 on a throughput regression.", help=NIGHTLY_HELP)
def nightly_cmd(
    trace: str | None = trace_option(help="Request log of the deployment (any format tuner trace reads). "
                                          "Default: the built-in synthetic mix."),
    window: str | None = typer.Option(None, "--window", help="Only the last part of --trace: 24h, 90m, 1d. Default: the whole log."),  # noqa: E501
    space: str = typer.Option("default", "--space", help="Search space: a shipped name or a YAML file (as tuner search)."),  # noqa: E501
    model: str | None = typer.Option(None, "--model", help="Model preset or local folder with config.json. Default: the space's."),  # noqa: E501
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type from the catalog (H100-SXM, L4, ...). Default: the space's."),  # noqa: E501
    gpus: str | None = typer.Option(None, "--gpus", help="GPUs: a count (8) or device ids (0-7)."),
    calibration: str | None = typer.Option(None, "--calibration", help="Simulator calibration profile YAML (efficiencies of this GPU class); a slower profile simulates a slower deployment."),  # noqa: E501
    target_ttft: str | None = typer.Option(None, "--target-ttft", help="P95 TTFT target: 2s, 500ms. Default: the space's."),  # noqa: E501
    backend: Backend = backend_option(),
    vllm_cmd: str | None = vllm_cmd_option(),
    endpoint: str | None = typer.Option(None, "--endpoint", help="Base URL of a running OpenAI-compatible server (endpoint backend)."),  # noqa: E501
    trials: int = typer.Option(20, "--trials", help="New trials tonight (the first re-runs last night's best configuration)."),  # noqa: E501
    timeout: str | None = typer.Option(None, "--timeout", help="Stop starting trials after this long: 2h, 45m, 3600 (seconds), as tuner search --timeout. Default: no limit but --trials."),  # noqa: E501
    wall_clock: str | None = old_spelling("--wall-clock"),
    threshold: str = typer.Option("10%", "--threshold", help="A best throughput this much below the last night of the same workload shape is a regression (exit 4)."),  # noqa: E501
    storage: str | None = storage_option(),
    study: str | None = typer.Option(None, "--study", help="Study name. Default: nightly.<deployment>.<space>, the same every night."),  # noqa: E501
    out: str | None = typer.Option(None, "--out", metavar="DIR", help="Folder for nightly.md/.html/.json and report.html. Default: studies/<study>/nightly/."),  # noqa: E501
    report_dir: str | None = old_spelling("--report-dir"),
    seed: int = typer.Option(0, "--seed", help="Sampler seed."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text: the verdict line and the report path; json: nightly.json on stdout."),  # noqa: E501
) -> None:

    backend, output = backend.value, output.value  # type: ignore[assignment]
    limit = parse_threshold(threshold)
    timeout = renamed(timeout, wall_clock, "--wall-clock")
    out = renamed(out, report_dir, "--report-dir")
    wall_s = parse_seconds(timeout, what="--timeout") if timeout else None
    if window and not trace:
        raise InputError("--window needs --trace", hint="give the request log to cut the window from")
    changes = deployment_changes(model=model, gpu=gpu, gpus=gpus)
    if calibration:
        from pathlib import Path

        if not Path(calibration).is_file():
            raise InputError("no such calibration profile", path=calibration)
        changes["calibration"] = calibration
    with bad_rows_advice(trace):
        target = parse_seconds(target_ttft, what="--target-ttft") if target_ttft else None
        prepared = prepare(space, deployment=changes, workload={"target_ttft_s": target, "trace": trace})
    workload = prepared.workload
    if window:
        workload = latest_window(workload, parse_seconds(window, what="--window"))

    with Bar("trials", trials, best=True) as progress:
        outcome = run_nightly(prepared.space, workload, backend=backend,
                              backend_options=backend_options(backend, vllm_cmd=vllm_cmd, endpoint=endpoint),
                              storage=storage, study=study, trials=trials, wall_clock_s=wall_s, threshold=limit,
                              report_dir=out, seed=seed, observer=progress)
    if output == "json":
        print((outcome.report.parent / "nightly.json").read_text())
    else:
        night = outcome.verdict.night
        repeats = f" and {night.repeats} confirmation repeats" if night.repeats else ""

        print(f"study {outcome.name} ({redact(outcome.storage)}): {night.new_trials} trials{repeats} tonight "
              f"in {outcome.wall_s:.1f} s")
        print(outcome.verdict.headline)
        print(f"report: {outcome.report}")
    if outcome.verdict.regression:
        raise RegressionDetected(f"{outcome.verdict.headline} (report: {outcome.report})")


__all__ = ["nightly_cmd"]

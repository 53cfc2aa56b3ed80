"""``tuner calibrate``: fit the simulator to a real vLLM on this machine's GPU."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer

from tuner.backends import backend_class
from tuner.backends.vllm_command import detect_version
from tuner.calibrate import (
    campaign_rows,
    design_trials,
    fit,
    measure,
    measurement_noise,
    read_measurements,
    read_names,
    replicate_pairs,
    write_profile,
)
from tuner.calibrate.profile import rewrite_report
from tuner.cli.app import app
from tuner.cli.options import CalibrationBackend, backend_option, old_spelling, renamed, vllm_cmd_option
from tuner.cli.progress import Bar
from tuner.core.errors import InputError
from tuner.core.units import parse_seconds
from tuner.serving.config import DEFAULT_VLLM_VERSION, Deployment
from tuner.sim.calibration import profile_section
from tuner.sim.hardware import get_gpu


class _Lines(Bar):
    """Calibration's progress: a line a step on the command's console (stdout, kept by a
    log), and on a terminal a spinner below them with the time spent (a fit runs for minutes
    without a line)."""

    def __init__(self, console: Any) -> None:
        super().__init__("calibrate", None)
        self.console = console

    def on_phase(self, text: str) -> None:
        self.console.print(text)  # on a terminal, rich prints it above the spinner


@app.command(
    "calibrate",
    short_help="Fit the simulator to a real vLLM on this machine's GPU.",
    help=(
        "Spend a few minutes of a real GPU to make the simulator accurate for it: start a small "
        "designed set of vLLM configurations (gpu-memory-utilization, max-num-seqs, "
        "max-num-batched-tokens, eager vs CUDA graphs, one max-model-len refusal), replay three "
        "closed-loop loads on each (1 user, a middle load, saturation), read vLLM's startup lines, "
        "fit the simulator's efficiencies, overheads and memory constants by least squares on half "
        "of the trials, check them on the other half, and write a profile that tuner estimate, "
        "tuner search --backend sim and the pre-check use whenever GPU and vLLM version match. "
        "Resumable: run it again to finish trials a --timeout cut short.\n\n"
        "\b\nExamples:\n"
        "  tuner calibrate --model /models/qwen2.5-7b --gpu H200\n"
        "  tuner calibrate --model qwen2.5-7b --gpu L4 --backend sim"
    ),
)
def calibrate(
    model: str = typer.Option(..., "--model", help="Model folder holding config.json (what vllm serve loads), "
                              "or a preset name with --backend sim."),
    gpu: str = typer.Option(..., "--gpu", help="GPU catalog name of the card vLLM runs on, e.g. H200 "
                            "(tuner's catalog; it sets the datasheet figures the fit scales)."),
    backend: CalibrationBackend = backend_option(
        CalibrationBackend.vllm,
        help="vllm: start real vllm serve processes (needs the GPU); sim: the embedded simulator, a dry run of "
             "the whole procedure."),
    vllm_version: str | None = typer.Option(None, "--vllm-version", help="vLLM version the profile is for; "
                                            "default: asked from --vllm-cmd's Python."),
    vllm_cmd: str = vllm_cmd_option("vllm serve", help="Command that starts vLLM, before the model (e.g. "
                                                       "'python -m vllm.entrypoints.cli.main serve')."),
    extra_args: str = typer.Option("", "--extra-args", help="Flags added to every vllm serve, e.g. "
                                   "'--load-format dummy' for random weights of the model's shape."),
    out: Path | None = typer.Option(None, "--out", metavar="DIR", help="Profile folder (measurements.jsonl, logs/, profile.yaml); "  # noqa: E501
                                    "default ~/.config/tuner/calibration/<gpu>-vllm-<version>, where the "
                                    "simulator looks."),
    timeout: str | None = typer.Option(None, "--timeout", help="Start no trial that would not finish within "
                                       "this long: 20m, 1h or 1200 (seconds); run again later to continue."),
    budget_s: str | None = old_spelling("--budget-s"),
    trials: str | None = typer.Option(None, "--trials", help="Comma-separated subset of the design "
                                      "(base, eager, refuse, seqs64, kvlimited, seqs16, mbt1024, eager128, mml8k, bs32)."),  # noqa: E501
    fit_only: bool = typer.Option(False, "--fit-only", help="Measure nothing; fit what --out already holds."),
    report_only: str | None = typer.Option(None, "--report-only", metavar="WHY", help="Measure and fit nothing: "
                                           "recompute the profile's errors for its constants as they stand (after a "
                                           "constant was set from other measurements, WHY says which) and write them "
                                           "into --out's profile.yaml."),
    fit_trials: str | None = typer.Option(None, "--fit-trials", help="Trials the fit sees (default: the first "
                                          "half of those with loads); the others are held back and checked."),
    fit_points: Path | None = typer.Option(None, "--fit-points", help="File of the load points (or whole trials) the "
                                           "fit sees, one a line ('trial: probe label'); the rest are held back "
                                           "and checked. Default: the folder's fit_points.txt, else --fit-trials."),
    exclude_points: Path | None = typer.Option(None, "--exclude-points", help="File of load points neither fitted nor "
                                               "checked (reason after ' # '). Default: the folder's "
                                               "excluded_points.txt."),
    graph_kv_fraction: float | None = typer.Option(None, "--graph-kv-fraction", help="Share of vLLM's CUDA-graph "
                                                   "estimate taken from the KV budget, fixed instead of fitted "
                                                   "(0 for vLLM 0.26.0: eager and graph starts get the same KV)."),
    starts: int = typer.Option(3, "--starts", help="Starts of the step-time fit: the class table, then draws "
                               "from its priors; the profile says whether they found the same optimum."),
    max_evals: int | None = typer.Option(None, "--max-evals", help="Cap on simulator evaluations per start "
                                         "(default: run to convergence, ~50-150 evaluations)."),
) -> None:
    from rich.console import Console
    from rich.table import Table



    timeout = renamed(timeout, budget_s, "--budget-s")
    seconds = parse_seconds(timeout, what="--timeout") if timeout else None
    backend = backend.value  # type: ignore[assignment]
    console = Console()
    gpu_name = get_gpu(gpu).name
    version = vllm_version
    if version is None and backend == "vllm" and not fit_only:
        version = detect_version(vllm_cmd)
        if version is None:
            raise InputError(f"cannot tell the vLLM version of {vllm_cmd!r}", hint="pass --vllm-version")
    version = version or DEFAULT_VLLM_VERSION
    folder = out or Path.home() / ".config" / "tuner" / "calibration" / f"{gpu_name.lower()}-vllm-{version}"
    dep = Deployment(model=model, gpu=gpu_name, vllm_version=version)
    design = design_trials(dep)
    if trials:
        keep = [t.strip() for t in trials.split(",") if t.strip()]
        unknown = sorted(set(keep) - {t.name for t in design})
        if unknown:
            raise InputError(f"unknown trial(s) {', '.join(unknown)}", hint=f"known: {', '.join(t.name for t in design)}")  # noqa: E501
        design = [t for t in design if t.name in keep]
    if report_only is not None:
        if not (folder / "profile.yaml").is_file():
            raise InputError(f"no profile to report on: {folder / 'profile.yaml'}", hint="fit one first (--fit-only)")
        errors = rewrite_report(folder, campaign_rows(folder), dep, why=report_only)
        for name in ("fit", "check"):
            if name in errors:
                e = errors[name]
                console.print(f"{name}: tokens/s MAPE {e['output_tokens_per_s_mape']:.1f} %, P95 TTFT "
                              f"{e['ttft_p95_s_mape']:.1f} %, TPOT {e['tpot_mean_s_mape']:.1f} %")
        console.print(f"profile: {folder / 'profile.yaml'} (constants untouched)")
        return
    if not fit_only:
        runner = _runner(backend, vllm_cmd=vllm_cmd, vllm_version=version, log_dir=folder / "logs",
                         extra_args=shlex.split(extra_args))
        with _Lines(console) as lines:
            measure(runner, dep, design, folder, budget_s=seconds, observer=lines,
                    meta={"gpu": gpu_name, "vllm_version": version, "backend": backend, "vllm_cmd": vllm_cmd,
                          "extra_args": extra_args, "model": model})
    rows = campaign_rows(folder)
    done = {r["trial"] for r in rows if r.get("kind") == "trial_end"}
    left = [t.name for t in design if t.name not in done]
    if left:
        console.print(f"not measured yet: {', '.join(left)} (run again to continue)")
    chosen = [t.strip() for t in fit_trials.split(",")] if fit_trials else None
    if starts < 1:
        raise InputError(f"--starts must be >= 1, got {starts}")
    points_file = fit_points or (folder / "fit_points.txt" if (folder / "fit_points.txt").is_file() else None)
    excluded_file = exclude_points or (folder / "excluded_points.txt"
                                       if (folder / "excluded_points.txt").is_file() else None)
    # run-to-run noise from a replicate run beside the measurements (same trials started again), if
    # any; an excluded point is no replicate of anything
    noise = measurement_noise(rows, read_measurements(folder / "replicate.jsonl"),
                              pairs=replicate_pairs(rows, read_names(excluded_file) if excluded_file else ()))
    with _Lines(console) as lines:
        result = fit(rows, dep, fit_trials=chosen, fit_points=read_names(points_file) if points_file else None,
                     exclude=read_names(excluded_file) if excluded_file else (), noise=noise, starts=starts,
                     max_nfev=max_evals, graph_fraction=graph_kv_fraction, observer=lines)
    old_meta = profile_section(folder / "profile.yaml", "fit").get("meta")
    meta = old_meta or next(({k: v for k, v in r.items() if k not in ("kind", "design")}
                             for r in rows if r.get("kind") == "meta"), None)
    path = write_profile(result, folder / "profile.yaml", gpu=gpu_name, vllm_version=version, meta=meta)

    table = Table(title=f"fit error ({gpu_name}, vLLM {version})")
    table.add_column("points")
    for col in ("throughput MAPE %", "P95 TTFT MAPE %", "TPOT MAPE %", "Spearman thr"):
        table.add_column(col, justify="right")
    for name, e in result.errors.items():
        if name == "kv":
            continue
        count = sum(1 for r in result.table if r["set"] == name)
        table.add_row(f"{name} ({count} load points)",
                      f"{e['output_tokens_per_s_mape']:.1f}", f"{e['ttft_p95_s_mape']:.1f}",
                      f"{e['tpot_mean_s_mape']:.1f}", f"{e.get('throughput_spearman_all', float('nan')):.2f}")
    console.print(table)
    est = Table(title="fitted constants (95 % intervals; 'prior': the data did not determine it)")
    for col in ("constant", "value", "95 % interval", "from"):
        est.add_column(col, justify="right" if col != "constant" else "left")
    for name, e in result.info["step_time"]["estimates"].items():
        est.add_row(name, f"{e['value']:.4g}", f"{e['ci95'][0]:.4g} - {e['ci95'][1]:.4g}", e["determined"])
    console.print(est)
    for a, b, rho in result.info["step_time"].get("correlated", []):
        console.print(f"{a} and {b} trade off (correlation {rho:+.2f}): their combination is determined, "
                      "each alone is not")
    kv = result.errors["kv"]
    console.print(f"KV cache size: worst error {kv['max_abs_error_pct']:.2f}% over {int(kv['starts'])} starts; "
                  f"refusals predicted {int(kv['refusals_matched'])} (estimated max model length off by "
                  f"{kv.get('refusal_max_model_len_error_pct', float('nan')):.2f}%)")
    console.print(f"profile: {path}")


def _runner(backend: str, **options: Any) -> Any:
    """The backend the campaign runs on, told those of ``options`` its constructor takes
    (the simulator takes none of vLLM's command, version, logs and flags)."""
    import inspect


    cls = backend_class(backend)
    takes = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in options.items() if k in takes})

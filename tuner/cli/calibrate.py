"""``tuner calibrate``: fit the simulator to a real vLLM on this machine's GPU."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

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
from tuner.cli.options import (
    CalibrationBackend,
    backend_option,
    gpu_option,
    model_option,
    old_spelling,
    out_option,
    renamed,
    timeout_option,
    vllm_cmd_option,
    vllm_version_option,
)
from tuner.cli.progress import Bar
from tuner.core.errors import InputError
from tuner.core.units import parse_seconds
from tuner.serving.config import DEFAULT_VLLM_VERSION, Deployment
from tuner.sim.calibration import profile_section
from tuner.sim.hardware import get_gpu

# The options of tuner calibrate, as it explains them (shared flags are spelt in tuner.cli.options).
ModelOpt = model_option("Model folder holding config.json (what vllm serve loads), or a preset name with "
                        "--backend sim.")
GpuOpt = gpu_option("GPU catalog name of the card vLLM runs on, e.g. H200 (tuner's catalog; it sets the datasheet "
                    "figures the fit scales).")
VllmVersionOpt = vllm_version_option("vLLM version the profile is for; default: asked from --vllm-cmd's Python.")
ExtraArgsOpt = Annotated[str, typer.Option("--extra-args", help="Flags added to every vllm serve, e.g. "
                                           "'--load-format dummy' for random weights of the model's shape.")]
OutOpt = out_option("Profile folder (measurements.jsonl, logs/, profile.yaml); default "
                    "~/.config/tuner/calibration/<gpu>-vllm-<version>, where the simulator looks.")
TimeoutOpt = timeout_option("Start no trial that would not finish within this long: 20m, 1h or 1200 (seconds); "
                            "run again later to continue.")
TrialsOpt = Annotated[str | None, typer.Option("--trials", help="Comma-separated subset of the design (base, eager, "
                                               "refuse, seqs64, kvlimited, seqs16, mbt1024, eager128, mml8k, "
                                               "bs32).")]
FitOnlyOpt = Annotated[bool, typer.Option("--fit-only", help="Measure nothing; fit what --out already holds.")]
ReportOnlyOpt = Annotated[str | None, typer.Option(
    "--report-only", metavar="WHY", help="Measure and fit nothing: recompute the profile's errors for its constants "
    "as they stand (after a constant was set from other measurements, WHY says which) and write them into --out's "
    "profile.yaml.")]
FitTrialsOpt = Annotated[str | None, typer.Option("--fit-trials", help="Trials the fit sees (default: the first half "
                                                  "of those with loads); the others are held back and checked.")]
FitPointsOpt = Annotated[Path | None, typer.Option(
    "--fit-points", help="File of the load points (or whole trials) the fit sees, one a line ('trial: probe "
    "label'); the rest are held back and checked. Default: the folder's fit_points.txt, else --fit-trials.")]
ExcludePointsOpt = Annotated[Path | None, typer.Option(
    "--exclude-points", help="File of load points neither fitted nor checked (reason after ' # '). Default: the "
    "folder's excluded_points.txt.")]
GraphKvFractionOpt = Annotated[float | None, typer.Option(
    "--graph-kv-fraction", help="Share of vLLM's CUDA-graph estimate taken from the KV budget, fixed instead of "
    "fitted (0 for vLLM 0.26.0: eager and graph starts get the same KV).")]
StartsOpt = Annotated[int, typer.Option("--starts", help="Starts of the step-time fit: the class table, then draws "
                                        "from its priors; the profile says whether they found the same optimum.")]
MaxEvalsOpt = Annotated[int | None, typer.Option("--max-evals", help="Cap on simulator evaluations per start "
                                                 "(default: run to convergence, ~50-150 evaluations).")]


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
    model: ModelOpt, gpu: GpuOpt,
    backend: CalibrationBackend = backend_option(
        CalibrationBackend.vllm,
        help="vllm: start real vllm serve processes (needs the GPU); sim: the embedded simulator, a dry run of "
             "the whole procedure."),
    vllm_version: VllmVersionOpt = None,
    vllm_cmd: str = vllm_cmd_option("vllm serve", help="Command that starts vLLM, before the model (e.g. "
                                                       "'python -m vllm.entrypoints.cli.main serve')."),
    extra_args: ExtraArgsOpt = "", out: OutOpt = None, timeout: TimeoutOpt = None,
    budget_s: str | None = old_spelling("--budget-s"), trials: TrialsOpt = None, fit_only: FitOnlyOpt = False,
    report_only: ReportOnlyOpt = None, fit_trials: FitTrialsOpt = None, fit_points: FitPointsOpt = None,
    exclude_points: ExcludePointsOpt = None, graph_kv_fraction: GraphKvFractionOpt = None, starts: StartsOpt = 3,
    max_evals: MaxEvalsOpt = None,
) -> None:
    from rich.console import Console

    timeout = renamed(timeout, budget_s, "--budget-s")
    seconds = parse_seconds(timeout, what="--timeout") if timeout else None
    if starts < 1:
        raise InputError(f"--starts must be >= 1, got {starts}")
    backend = backend.value  # type: ignore[assignment]
    console = Console()
    gpu_name = get_gpu(gpu).name
    version = _version(vllm_version, vllm_cmd, ask=backend == "vllm" and not fit_only)
    folder = Path(out) if out else Path.home() / ".config" / "tuner" / "calibration" / f"{gpu_name.lower()}-vllm-{version}"  # noqa: E501
    dep = Deployment(model=model, gpu=gpu_name, vllm_version=version)
    design = _design(dep, trials)
    if report_only is not None:
        return _report_only(console, folder, dep, report_only)
    if not fit_only:
        _measure(console, dep, design, folder, backend=backend, vllm_cmd=vllm_cmd, extra_args=extra_args,
                 budget_s=seconds)
    rows = campaign_rows(folder)
    done = {r["trial"] for r in rows if r.get("kind") == "trial_end"}
    left = [t.name for t in design if t.name not in done]
    if left:
        console.print(f"not measured yet: {', '.join(left)} (run again to continue)")
    with _Lines(console) as lines:
        result = _fit(rows, dep, folder, fit_trials=fit_trials, fit_points=fit_points, exclude_points=exclude_points,
                      starts=starts, max_nfev=max_evals, graph_fraction=graph_kv_fraction, observer=lines)
    # the profile keeps the campaign's meta (GPU, version, command) of its first fit
    old_meta = profile_section(folder / "profile.yaml", "fit").get("meta")
    meta = old_meta or next(({k: v for k, v in r.items() if k not in ("kind", "design")}
                             for r in rows if r.get("kind") == "meta"), None)
    path = write_profile(result, folder / "profile.yaml", gpu=gpu_name, vllm_version=version, meta=meta)
    _print_fit(console, result, f"{gpu_name}, vLLM {version}")
    console.print(f"profile: {path}")


def _measure(console: Any, dep: Deployment, design: list[Any], folder: Path, *, backend: str, vllm_cmd: str,
             extra_args: str, budget_s: float | None) -> None:
    """The designed trials not yet in ``folder`` measured on ``backend`` (a line a step on
    ``console``), with what they ran on as the campaign's meta."""
    runner = _runner(backend, vllm_cmd=vllm_cmd, vllm_version=dep.vllm_version, log_dir=folder / "logs",
                     extra_args=shlex.split(extra_args))
    with _Lines(console) as lines:
        measure(runner, dep, design, folder, budget_s=budget_s, observer=lines,
                meta={"gpu": dep.gpu, "vllm_version": dep.vllm_version, "backend": backend, "vllm_cmd": vllm_cmd,
                      "extra_args": extra_args, "model": dep.model})


def _version(given: str | None, vllm_cmd: str, *, ask: bool) -> str:
    """The vLLM version the profile is for: ``--vllm-version``, else (``ask``: vLLM is to be
    started) the one ``--vllm-cmd``'s Python has, else tuner's default."""
    if given is None and ask:
        given = detect_version(vllm_cmd)
        if given is None:
            raise InputError(f"cannot tell the vLLM version of {vllm_cmd!r}", hint="pass --vllm-version")
    return given or DEFAULT_VLLM_VERSION


def _design(dep: Deployment, trials: str | None) -> list[Any]:
    """The designed trials for ``dep``, or the ``--trials`` subset of them (names checked)."""
    design = design_trials(dep)
    if not trials:
        return design
    keep = [t.strip() for t in trials.split(",") if t.strip()]
    unknown = sorted(set(keep) - {t.name for t in design})
    if unknown:
        raise InputError(f"unknown trial(s) {', '.join(unknown)}", hint=f"known: {', '.join(t.name for t in design)}")
    return [t for t in design if t.name in keep]


def _report_only(console: Any, folder: Path, dep: Deployment, why: str) -> None:
    """``--report-only WHY``: the profile's errors recomputed for its constants as they stand."""
    if not (folder / "profile.yaml").is_file():
        raise InputError(f"no profile to report on: {folder / 'profile.yaml'}", hint="fit one first (--fit-only)")
    errors = rewrite_report(folder, campaign_rows(folder), dep, why=why)
    for name in ("fit", "check"):
        if name in errors:
            e = errors[name]
            console.print(f"{name}: tokens/s MAPE {e['output_tokens_per_s_mape']:.1f} %, P95 TTFT "
                          f"{e['ttft_p95_s_mape']:.1f} %, TPOT {e['tpot_mean_s_mape']:.1f} %")
    console.print(f"profile: {folder / 'profile.yaml'} (constants untouched)")


def _fit(rows: list[dict[str, Any]], dep: Deployment, folder: Path, *, fit_trials: str | None,
         fit_points: Path | None, exclude_points: Path | None, **options: Any) -> Any:
    """The fit of the folder's measurements: the points it sees and those it leaves out from the
    flags or the folder's files, and the run-to-run noise of a replicate run beside them."""
    chosen = [t.strip() for t in fit_trials.split(",")] if fit_trials else None
    points_file = fit_points or (folder / "fit_points.txt" if (folder / "fit_points.txt").is_file() else None)
    excluded_file = exclude_points or (folder / "excluded_points.txt"
                                       if (folder / "excluded_points.txt").is_file() else None)
    excluded = read_names(excluded_file) if excluded_file else ()
    # run-to-run noise from a replicate run beside the measurements (same trials started again), if
    # any; an excluded point is no replicate of anything
    noise = measurement_noise(rows, read_measurements(folder / "replicate.jsonl"),
                              pairs=replicate_pairs(rows, excluded))
    return fit(rows, dep, fit_trials=chosen, fit_points=read_names(points_file) if points_file else None,
               exclude=excluded, noise=noise, **options)


def _print_fit(console: Any, result: Any, where: str) -> None:
    """The fit's errors per set of points, the fitted constants with their intervals, the pairs
    that trade off, and how well the KV cache sizes and refusals came out."""
    from rich.table import Table

    table = Table(title=f"fit error ({where})")
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


def _runner(backend: str, **options: Any) -> Any:
    """The backend the campaign runs on, told those of ``options`` its constructor takes
    (the simulator takes none of vLLM's command, version, logs and flags)."""
    import inspect

    cls = backend_class(backend)
    takes = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in options.items() if k in takes})

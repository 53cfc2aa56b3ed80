"""``tuner estimate``: a what-if on the simulator, without a study. Prints vLLM's startup
memory plan for one configuration (or vLLM's refusal) and, with --concurrency or --rate,
a load table from the simulated engine."""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tuner.cli._knobs import SET_HELP, build_deployment_config, pins, with_knob_options
from tuner.cli.app import app
from tuner.cli.options import (
    Output,
    concurrency_option,
    dtype_option,
    gpu_option,
    gpus_option,
    model_option,
    num_requests_option,
    old_spelling,
    output_option,
    quantization_option,
    rate_option,
    renamed,
    replicas_option,
    set_option,
    skip_bad_option,
    tensor_parallel_size_option,
    trace_option,
    vllm_version_option,
)
from tuner.cli.progress import Runs
from tuner.core.errors import ConfigRejected, InputError
from tuner.runtime.progress import observer_or_headless
from tuner.search.recipe import FRONT_END_BOUND, front_end_cap, front_end_note
from tuner.search.refusal import MEMORY_REFUSALS, prediction
from tuner.serving.config import DEFAULT_VLLM_VERSION, Deployment, ServeConfig
from tuner.serving.load import Concurrency, Load, Poisson
from tuner.serving.result import bench_fields
from tuner.sim.engine import simulate
from tuner.sim.hardware import GiB
from tuner.sim.memory import MemoryPlan, plan_memory
from tuner.traffic import load_trace
from tuner.traffic.workload import Request, Workload

if TYPE_CHECKING:
    from tuner.runtime.progress import Observer

LOAD_KEYS = ("ttft_mean_s", "ttft_p95_s", "tpot_mean_s", "tokens_per_s", "output_tokens_per_s",
             "requests_per_s")


def parse_list(text: str | None, kind: type, option: str) -> list:
    """``"5,10,20"`` -> ``[5, 10, 20]``; InputError naming the option otherwise."""
    if not text:
        return []
    try:
        values = [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise InputError(f"{option} takes a comma-separated list of numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise InputError(f"{option} values must be > 0, got {text!r}")
    return values


def build_workload(trace: str | None, input_len: int | None, output_len: int | None,
                   num_requests: int | None, seed: int = 0, *, skip_bad: bool = False) -> Workload:
    """--trace FILE (its first ``num_requests`` rows when given; malformed rows skipped
    with ``skip_bad``), else fixed lengths (as ``vllm bench serve --dataset-name random``
    with range ratio 0), else the built-in mix of article 004; ``num_requests`` defaults to
    1000 for the last two."""
    if trace:
        workload = load_trace(trace, skip_bad=skip_bad)
        return workload.take(slice(0, num_requests)) if num_requests else workload
    num_requests = num_requests or 1000
    if input_len is None and output_len is None:
        try:
            from tuner.traffic.synth import default_workload
        except ImportError:  # the traffic package is optional for the planner
            input_len, output_len = 1024, 128
        else:
            return default_workload(seed=seed, n=num_requests)
    rows = [Request(0.0, input_len or 1024, output_len or 128)] * num_requests
    return Workload.from_requests(rows, source=f"fixed {input_len or 1024}/{output_len or 128} tokens")


def run_loads(deployment: Deployment, config: ServeConfig, workload: Workload,
              loads: list[Load], router: str = "round_robin", observer: Observer | None = None) -> list[dict[str, Any]]:
    """One simulated run per load; rows with tuner's aggregates (seconds) and the same under
    ``vllm bench serve``'s names (:func:`tuner.serving.result.bench_fields`, milliseconds).
    ``observer`` sees a phase a load (``None``: headless)."""

    obs = observer_or_headless(observer)
    rows = []
    for load in loads:
        obs.on_phase(f"load run at {load.users} users" if isinstance(load, Concurrency) else
                     f"load run at {load.rate:g} req/s")
        result = simulate(deployment, config, workload, load, router=router)
        summary = result.summary()
        row: dict[str, Any] = (
            {"concurrency": load.users} if isinstance(load, Concurrency) else {"rate": load.rate}
        )
        row.update({k: float(summary.get(k, float("nan"))) for k in LOAD_KEYS})
        row.update(bench_fields(summary, load))  # vllm bench serve's names and units (ms)
        rows.append(row)
    return rows


def _graph_line(plan: Any) -> str:
    """The CUDA-graph memory taken from the KV budget. A calibration profile may say the
    version logs its graph memory without charging it (vLLM 0.26.0 on the H200 did)."""
    charged = (plan.budget_bytes - plan.weight_bytes - plan.activation_bytes
               - plan.non_torch_bytes - plan.kv_bytes)
    line = f"  - CUDA graphs              {_gib(charged)}"
    if plan.cudagraph_bytes and charged < plan.cudagraph_bytes * 0.99:
        line += f"  (captures {_gib(plan.cudagraph_bytes).strip()}; not charged to KV by this vLLM version)"
    return line


def _gib(n: int) -> str:
    return f"{n / GiB:8.2f} GiB"


def decode_ceiling(plan: MemoryPlan) -> float:
    """Upper bound on single-stream decode: every step reads all weights of one rank over HBM."""
    return plan.gpu.hbm_bandwidth / plan.weight_bytes


def render_plan(plan: MemoryPlan) -> list[str]:
    m, g = plan.model, plan.gpu
    quant = plan.quantization or "none"
    lines = [
        f"{plan.config.replicas} x TP{plan.config.tensor_parallel_size} of {m.name} ({m.param_count() / 1e9:.1f}B "
        f"params, {plan.dtype}, quantization {quant}) on {g.name} "
        f"(CC {g.compute_capability[0]}.{g.compute_capability[1]}, {g.memory_gib:.2f} GiB), "
        f"vLLM {plan.vllm_version}",
        f"knobs: gpu-memory-utilization {plan.config.gpu_memory_utilization:g}, max-model-len "
        f"{plan.config.max_model_len}, max-num-seqs {plan.config.max_num_seqs}, max-num-batched-tokens "
        f"{plan.config.max_num_batched_tokens}, block-size {plan.config.block_size}, "
        f"{'eager' if plan.config.enforce_eager else 'CUDA graphs'}, KV {plan.kv_cache_dtype_bytes} B/elem, "
        f"{plan.engine} engine, {plan.attention_backend}",
        "memory per GPU:",
        f"  total (as torch reports)   {_gib(g.memory_bytes)}",
        f"  budget (x utilization)     {_gib(plan.budget_bytes)}",
        f"  - weights                  {_gib(plan.weight_bytes)}",
        f"  - profile activations      {_gib(plan.activation_bytes)}",
        f"  - non-torch{' + CUDA context' if not plan.v1 else ''}{' ' * (16 if plan.v1 else 1)}"
        f"{_gib(plan.non_torch_bytes)}",
        _graph_line(plan),
        f"  = KV cache                 {_gib(plan.kv_bytes)}",
        f"  block: {plan.config.block_size} tokens x {plan.page_bytes // plan.config.block_size:,} B/token = "
        f"{plan.page_bytes / 2**20:.2f} MiB; blocks: {plan.num_gpu_blocks:,}",
    ]
    lines.append(
        f"decode ceiling (one stream): {g.hbm_bandwidth / 1e9:.0f} GB/s / "
        f"{plan.weight_bytes / 1e9:.2f} GB of weights per GPU = {decode_ceiling(plan):.0f} tok/s"
    )
    lines += [f"note: {n}" for n in plan.notes]
    if plan.error is None:
        lines.append(
            f"GPU KV cache size: {plan.kv_cache_tokens:,} tokens, Maximum concurrency for "
            f"{plan.config.max_model_len:,} tokens per request: {plan.max_concurrency:.2f}x"
        )
    else:
        lines.append(f"vLLM refuses to start ({plan.error.kind}): {plan.error.message}")
    return lines


def render_loads(rows: list[dict[str, Any]]) -> list[str]:
    key = "concurrency" if "concurrency" in rows[0] else "rate"
    head = (f"{key:>11} {'TTFT mean':>10} {'TTFT p95':>10} {'TPOT mean':>10} "
            f"{'tok/s in+out':>13} {'out tok/s':>10} {'req/s':>8}")
    lines = [head]
    for r in rows:
        lines.append(
            f"{r[key]:>11g} {r['ttft_mean_s'] * 1e3:>8.0f}ms {r['ttft_p95_s'] * 1e3:>8.0f}ms "
            f"{r['tpot_mean_s'] * 1e3:>8.1f}ms {r['tokens_per_s']:>13.0f} "
            f"{r['output_tokens_per_s']:>10.0f} {r['requests_per_s']:>8.2f}"
        )
    return lines


def front_end_notes(deployment: Deployment, config: ServeConfig, rows: list[dict[str, Any]]) -> list[str]:
    """One note where loads' output tokens/s reach what the API server processes can stream
    (:func:`tuner.search.recipe.front_end_note`, for the fastest of them)."""

    cap = front_end_cap(deployment, config) if rows else None
    if cap is None:
        return []
    key = "concurrency" if "concurrency" in rows[0] else "rate"
    bound = [r for r in rows if r["output_tokens_per_s"] >= FRONT_END_BOUND * cap[2]]
    if not bound:
        return []
    where = f"at {key} " + ", ".join(f"{r[key]:g}" for r in bound)
    note = front_end_note(deployment, config, max(r["output_tokens_per_s"] for r in bound), where, cap)
    return [f"note: {note}"] if note else []


#: ``tuner estimate --help`` (a constant: the docstring would make the command longer than it reads).
ESTIMATE_HELP = """What would vLLM do with this GPU, model and flags?

Prints the startup memory plan (weights, activations, CUDA graphs, KV bytes,
blocks, "GPU KV cache size", max concurrency) or vLLM's refusal in vLLM's words
(exit 1), and with --concurrency or --rate a simulated load table. No study is
read or written.

\b
Examples:
  tuner estimate --gpu H200 --model qwen2.5-7b -c 1,16,64
  tuner estimate --gpu V100-16GB --model gemma-2-27b-gptq \\
      --max-model-len 8192 --enforce-eager --vllm-version 0.6.3"""

# The options of tuner estimate, as it explains them (the flags are spelt in tuner.cli.options).
GpuOpt = gpu_option("GPU from the catalog (case-insensitive; `tuner.sim.hardware.list_gpus()`), e.g. H200, "
                    "V100-32GB-SXM2, T4, L4.")
GpusOpt = gpus_option("GPUs in the machine: a count (8) or device ids (0-7). Default: tp x replicas. vLLM cannot "
                      "start if tp x replicas exceeds it.")
ModelOpt = model_option("Preset (qwen2.5-7b, llama-3.1-70b, gemma-2-27b-awq, ...) or a folder with a Hugging Face "
                        "config.json.")
QuantizationOpt = quantization_option("awq, gptq, fp8, ... Default: whatever the checkpoint's config.json says.")
DtypeOpt = dtype_option("auto, float16/half, bfloat16. bfloat16 needs compute capability 8.0 (vLLM refuses it on "
                        "V100/T4).")
VllmVersionOpt = vllm_version_option("vLLM release whose defaults and messages to follow (e.g. 0.6.3, 0.26.0).")
TensorParallelSizeOpt = tensor_parallel_size_option("Tensor-parallel size: GPUs per replica; must divide the "
                                                    "attention heads. Default 1.")
ReplicasOpt = replicas_option("Independent engines (data parallel).")
SetOpt = set_option(SET_HELP)
ConcurrencyOpt = concurrency_option("Closed-loop load table: comma-separated users in flight, e.g. 5,10,20.")
RateOpt = rate_option("Open-loop load table: comma-separated Poisson request rates in req/s, e.g. 1,2,4.")
SkipBadOpt = skip_bad_option()
InputLenOpt = Annotated[int | None, typer.Option("--input-len", help="Fixed prompt tokens (like vllm bench "
                                                 "--dataset-name random); replaces the built-in mix.")]
OutputLenOpt = Annotated[int | None, typer.Option("--output-len", help="Fixed output tokens per request.")]
NumRequestsOpt = num_requests_option("Requests per load level: 1000 of the built-in mix or fixed lengths by "
                                     "default; with --trace, its first N rows (default: all).")
OutputOpt = output_option()


@app.command("estimate", short_help="vLLM's memory plan and a load table for one configuration.", help=ESTIMATE_HELP)
@with_knob_options()
def estimate_cmd(
    gpu: GpuOpt = "H100-SXM", gpus: GpusOpt = None, model: ModelOpt = "qwen2.5-7b",
    quantization: QuantizationOpt = None, dtype: DtypeOpt = "auto", vllm_version: VllmVersionOpt = DEFAULT_VLLM_VERSION,
    tensor_parallel_size: TensorParallelSizeOpt = None, tp: int = old_spelling("--tp"), replicas: ReplicasOpt = 1,
    set_: SetOpt = None, concurrency: ConcurrencyOpt = None, rate: RateOpt = None,
    trace: str = trace_option(help="Request log to replay (any format `tuner trace stats` reads). Default: "
                                   "the built-in 40/40/20 mix of article 004."),
    skip_bad: SkipBadOpt = False, input_len: InputLenOpt = None, output_len: OutputLenOpt = None,
    num_requests: NumRequestsOpt = None, output: OutputOpt = Output.text,
    *,
    knob_flags: dict[str, Any],  # the knobs' options (with_knob_options)
) -> None:
    knobs, _ = pins(knob_flags, set_)
    tp = renamed(tensor_parallel_size, tp, "--tp")
    deployment, config = build_deployment_config(
        model=model, gpu=gpu, gpus=gpus, vllm_version=vllm_version, dtype=dtype, quantization=quantization,
        tp=1 if tp is None else tp, replicas=replicas, knobs=knobs,
    )
    loads: list[Load] = [Concurrency(u) for u in parse_list(concurrency, int, "--concurrency")]
    loads += [Poisson(r) for r in parse_list(rate, float, "--rate")]
    plan, error = _memory_plan(deployment, config)
    rows: list[dict[str, Any]] = []
    if error is None and loads:
        workload = build_workload(trace, input_len, output_len, num_requests, skip_bad=skip_bad)
        with Runs(len(loads)) as progress:
            rows = run_loads(deployment, config, workload, loads, observer=progress)
    if output is Output.json:
        _print_json(deployment, config, plan, error, rows)
    else:
        _print_text(deployment, config, plan, error, rows)
    if error is not None:
        sys.exit(1)


def _memory_plan(deployment: Deployment, config: ServeConfig) -> tuple[MemoryPlan | None, ConfigRejected | None]:
    """vLLM's startup memory plan and its refusal, if any (no plan where even the plan is refused)."""
    try:
        plan = plan_memory(deployment, config, strict=False)
    except ConfigRejected as err:
        return None, err
    return plan, plan.error


def _print_json(deployment: Deployment, config: ServeConfig, plan: MemoryPlan | None,
                error: ConfigRejected | None, rows: list[dict[str, Any]]) -> None:
    """``--output json``: the memory plan (or vLLM's refusal and the prediction's margin), the load
    table and the GPUs the layout leaves idle, as one JSON object."""
    memory = dict(plan.summary(), decode_ceiling_tokens_per_s=decode_ceiling(plan)) if plan is not None else {
        "kv_cache_tokens": None, "num_gpu_blocks": None, "max_concurrency": None}
    memory["error"] = None if error is None else error.message
    memory["error_kind"] = None if error is None else error.kind
    if error is not None and error.kind in MEMORY_REFUSALS:
        memory["predicted_refusal"] = prediction(deployment, config, error)
    idle = deployment.idle_devices(config.tensor_parallel_size, config.replicas)  # as tuner search says it
    typer.echo(json.dumps({"memory": memory, "load": rows, "idle_gpus": list(idle)}, indent=2))


def _print_text(deployment: Deployment, config: ServeConfig, plan: MemoryPlan | None,
                error: ConfigRejected | None, rows: list[dict[str, Any]]) -> None:
    """The memory plan, a note on idle GPUs, vLLM's refusal with the prediction's margin, and the
    load table with its front-end notes, for a person."""
    if plan is not None:
        typer.echo("\n".join(render_plan(plan)))
    if deployment.idle_devices(config.tensor_parallel_size, config.replicas):
        typer.echo(f"note: {deployment.idle_note(config.tensor_parallel_size, config.replicas)}")
    if plan is None and error is not None:  # a refusal the plan holds is among its lines already
        typer.echo(f"vLLM refuses to start ({error.kind}): {error.message}")
    if error is not None and error.kind in MEMORY_REFUSALS:  # how sure: the margin against the planner's error
        typer.echo(f"the prediction's margin: {prediction(deployment, config, error)['text']}; to put it to the "
                   "test on the GPU: tuner search --backend vllm --start-refused")
    if rows:
        typer.echo("")
        typer.echo("\n".join(render_loads(rows)))
        for line in front_end_notes(deployment, config, rows):
            typer.echo(line)

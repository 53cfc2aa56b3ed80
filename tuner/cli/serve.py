"""``tuner sim-serve``: the simulated vLLM as a real HTTP server (see :mod:`tuner.sim.server`)."""
from __future__ import annotations

import sys

import typer

from tuner.cli.app import app


@app.command(
    "sim-serve",
    short_help="Serve the simulated vLLM over HTTP with vllm serve's flags.",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
    help=(
        "Serve the simulated vLLM engine over HTTP in real time, with vllm serve's flag names "
        "(--gpu-memory-utilization, --max-num-seqs, --max-model-len, --block-size, "
        "--max-num-batched-tokens, --[no-]enable-prefix-caching, --enforce-eager, --kv-cache-dtype, "
        "-tp, --dtype, --quantization, --port, --host), plus --gpu, --vllm-version and --speed. "
        "Refuses to start where vLLM would (same message, exit 1); serves /health, /v1/models, "
        "/v1/completions, /v1/chat/completions, /metrics. Point the vLLM backend at it with "
        "--vllm-cmd 'python -m tuner sim-serve'. Run `tuner sim-serve --help` for every flag.\n\n"
        "\b\nExample:\n"
        "  tuner sim-serve Qwen/Qwen2.5-7B-Instruct --gpu H100-SXM --port 8000"
    ),
)
def sim_serve(ctx: typer.Context) -> None:
    from tuner.sim.command import main

    code = main(list(ctx.args))
    if code:
        sys.exit(code)

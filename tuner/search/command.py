"""The ``vllm serve`` command line a user copies."""
from __future__ import annotations

from tuner.backends.vllm_args import render_flags
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.model import serve_model_name


def serve_command(deployment: Deployment, config: ServeConfig) -> str:
    """The ``vllm serve`` command line of ``config`` for the deployment's vLLM version
    (flags from :func:`tuner.backends.vllm_args.render_flags`, without host and port).
    Replicas become ``--data-parallel-size`` (independent engine replicas behind one API
    server; max-num-seqs applies per replica there too)."""
    import shlex

    flags = render_flags(deployment, config, deployment.vllm_version, host="0.0.0.0", port=8000)
    argv = ["vllm", "serve", serve_model_name(deployment.model)]
    skip = False
    for flag in flags:
        if skip or flag in ("--host", "--port"):
            skip = not skip
            continue
        argv.append(flag)
    if config.replicas > 1:
        argv += ["--data-parallel-size", str(config.replicas)]
    return shlex.join(argv)

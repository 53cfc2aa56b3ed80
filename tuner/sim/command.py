"""``tuner sim-serve``'s command line: ``vllm serve``'s flag names for the knobs the tuner sets
(:func:`build_parser`), the engine and server they make (:func:`build_server`), and :func:`main`."""
from __future__ import annotations

import argparse
import sys
import time

from aiohttp import web

from tuner.core.errors import ConfigRejected, TunerError
from tuner.core.knobs import KNOBS
from tuner.serving.config import DEFAULT_VLLM_VERSION, Deployment, ServeConfig
from tuner.sim.engine import EngineCore
from tuner.sim.memory import plan_memory
from tuner.sim.server import SimServer


def build_parser() -> argparse.ArgumentParser:
    """``vllm serve``'s flag names for the knobs the tuner sets, plus the simulator's own."""
    p = argparse.ArgumentParser(
        prog="tuner sim-serve",
        description="Serve the simulated vLLM engine over HTTP in real time, with vllm serve's "
                    "flags, endpoints, log lines and metric names. Binds 127.0.0.1 by default.",
    )
    p.add_argument("model", help="Model preset (e.g. qwen2.5-7b) or folder holding config.json.")
    p.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
    p.add_argument("--port", type=int, default=8000, help="Port to listen on (default 8000).")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="Model name(s) clients use (default: the MODEL argument); responses carry the first.")
    for knob in KNOBS:  # vllm serve's knob flags (tuner.core.knobs); unset: vLLM's default for the version
        flag = f"--{knob.flag}"
        if knob.type is bool and knob.negatable_since is not None:
            p.add_argument(flag, dest=knob.name, action=argparse.BooleanOptionalAction, default=None, help=knob.help)
        elif knob.type is bool:
            p.add_argument(flag, dest=knob.name, action="store_true", help=knob.help)
        else:
            p.add_argument(flag, dest=knob.name, type=knob.type, default=knob.unset, choices=knob.choices or None,
                           help=knob.help)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="GPUs one replica is split over.")
    p.add_argument("--dtype", default="auto", help="Weight/activation dtype (auto, half, bfloat16, ...).")
    p.add_argument("--quantization", "-q", default=None, help="Weight quantization method.")
    p.add_argument("--load-format", default=None, help="Accepted and ignored (nothing is loaded).")
    p.add_argument("--disable-log-requests", action="store_true",
                   help="Accepted for vLLM < 0.12 command lines; the simulator never logs requests.")
    p.add_argument("--gpu", default="H100-SXM", help="[sim] GPU catalog name to simulate.")
    p.add_argument("--vllm-version", default=None,
                   help="[sim] vLLM version whose defaults and messages to follow.")
    p.add_argument("--calibration", default=None, help="[sim] Calibration profile YAML for step times.")
    p.add_argument("--speed", type=float, default=1.0,
                   help="[sim] Run this many times faster than real time (tests use 10-100).")
    p.add_argument("--startup-delay-s", type=float, default=0.0,
                   help="[sim] Sleep this long before serving, like a model load.")
    return p


def _log(line: str, stream=sys.stdout) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"INFO {stamp} [sim-serve] {line}", file=stream, flush=True)


def build_server(args: argparse.Namespace) -> SimServer:
    """Plan memory and build the engine for parsed flags; raises ConfigRejected/InputError."""

    version = args.vllm_version or DEFAULT_VLLM_VERSION
    prefix = args.enable_prefix_caching
    if prefix is None:
        from tuner.core.versions import parse_version

        prefix = parse_version(version) >= (0, 7)  # V0 (0.6 line) left it off by default
    deployment = Deployment(model=args.model, gpu=args.gpu, gpu_count=args.tensor_parallel_size,
                            vllm_version=version, dtype=args.dtype, quantization=args.quantization,
                            calibration=args.calibration)
    knobs = {k.name: getattr(args, k.name) for k in KNOBS}
    config = ServeConfig(**{**knobs, "enable_prefix_caching": prefix}, tensor_parallel_size=args.tensor_parallel_size)
    plan = plan_memory(deployment, config)
    for line in plan.log_lines():
        _log(line)
    profile = None
    if args.calibration:
        from tuner.sim.calibration import load_calibration

        profile = load_calibration(plan.gpu, args.calibration)
    engine = EngineCore(plan, profile)
    names = args.served_model_name or [args.model]
    return SimServer(engine, model_name=names[0], aliases=tuple(names[1:]),
                     max_model_len=plan.config.max_model_len, block_size=plan.config.block_size,
                     num_gpu_blocks=plan.num_gpu_blocks, speed=args.speed, vllm_version=version)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tuner sim-serve``, ``python -m tuner.sim.command`` and ``python -m tuner.sim.server``."""

    args = build_parser().parse_args(argv)  # bad flags: argparse's message, exit 2, like vLLM
    if not args.speed > 0:
        print("tuner sim-serve: --speed must be > 0", file=sys.stderr)
        return 2
    try:
        server = build_server(args)
    except ConfigRejected as err:
        # vLLM dies with the exception's message as the last line of its traceback.
        print(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [sim-serve] EngineCore failed to start.",
              file=sys.stderr, flush=True)
        print(f"ValueError: {err.message}", file=sys.stderr, flush=True)
        return 1
    except TunerError as err:
        print(f"tuner sim-serve: {err}", file=sys.stderr, flush=True)
        return getattr(err, "exit_code", 1) or 1
    if args.startup_delay_s > 0:
        time.sleep(args.startup_delay_s)
    _log(f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
    web.run_app(server.app(), host=args.host, port=args.port, print=None, access_log=None,
                shutdown_timeout=2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``tuner sim-serve`` with one fault of a real vLLM host, for tests/faults/staged.py.

Run as ``python faulty.py --fault KIND [--state DIR] [--rate P] [--seed N] sim-serve ARGS``:
everything after ``sim-serve`` is ``tuner sim-serve``'s (so tuner takes the command line
for sim-serve's and passes ``--speed``, ``--gpu``, ``--vllm-version``). Each fault is what
a site meets, in vLLM's words, after the engine began loading the model (the line
``Starting to load model ...`` is logged first, as vLLM's model runner does):

* ``knob``: a start with ``--max-num-seqs`` of 256 or more dies, naming the value
  (a configuration's fault: every such value crashes, every smaller one serves);
* ``hexid``: every start dies with a line carrying a fresh address, handle and pid
  (the machine's fault: no configuration starts);
* ``transient``: a start dies with probability ``--rate`` (the machine's, now and then);
  the draws are seeded and counted in ``--state`` (``starts``, one line per start:
  ``ok`` or ``crash`` and the time), so a run is reproducible;
* ``warmup503``: ``/health`` answers at once, ``/v1/completions`` answers 503 for the first
  ``--rate`` seconds (vLLM's API server up before its engine is ready to serve).
"""
from __future__ import annotations

import argparse
import os
import random
import secrets
import sys
import time
from pathlib import Path


def _log(line: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [gpu_model_runner.py:1624] {line}", flush=True)


def _die(line: str) -> int:
    print("ERROR {} [core.py:700] EngineCore failed to start.".format(time.strftime("%m-%d %H:%M:%S")),
          file=sys.stderr, flush=True)
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "/usr/lib/python3/dist-packages/vllm/v1/engine/core.py", line 691, in run_engine_core',
          file=sys.stderr)
    print(line, file=sys.stderr, flush=True)
    return 1


def _flag(args: list[str], name: str, default: str | None = None) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _draw(state: Path, rate: float, seed: int) -> bool:
    """Whether this start crashes: the n-th draw of a seeded sequence (n counted in ``state``)."""
    state.mkdir(parents=True, exist_ok=True)
    log = state / "starts"
    n = len(log.read_text().splitlines()) if log.exists() else 0
    crash = random.Random(seed * 100_003 + n).random() < rate
    with open(log, "a") as fh:
        fh.write(f"{'crash' if crash else 'ok'} {time.time():.3f}\n")
    return crash


def _serve_with_503(rest: list[str], seconds: float) -> int:
    from aiohttp import web

    from tuner.sim.command import _log as sim_log
    from tuner.sim.command import build_parser, build_server

    args = build_parser().parse_args(rest)
    server = build_server(args)
    app = server.app()
    ready_at = time.monotonic() + seconds

    @web.middleware
    async def not_ready(request, handler):
        if request.path.startswith("/v1/completions") and time.monotonic() < ready_at:
            return web.json_response({"error": {"message": "The engine is not ready yet", "type": "ServiceUnavailable",
                                                "param": None, "code": 503}}, status=503)
        return await handler(request)

    app.middlewares.append(not_ready)
    sim_log(f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=2.0)
    return 0


def main() -> int:
    argv = sys.argv[1:]
    if "sim-serve" not in argv:
        sys.exit("faulty.py: give sim-serve and its arguments last")
    cut = argv.index("sim-serve")
    p = argparse.ArgumentParser()
    p.add_argument("--fault", required=True, choices=["knob", "hexid", "transient", "warmup503"])
    p.add_argument("--state", default=".faulty")
    p.add_argument("--rate", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    opts = p.parse_args(argv[:cut])
    rest = argv[cut + 1:]
    from tuner.sim.command import build_parser

    model = build_parser().parse_known_args(rest)[0].model
    if opts.fault == "warmup503":
        return _serve_with_503(rest, opts.rate)
    _log(f"Starting to load model {model}...")
    if opts.fault == "knob" and int(_flag(rest, "--max-num-seqs", "128")) >= 256:
        seqs = _flag(rest, "--max-num-seqs")
        return _die(f"RuntimeError: CUDA graph capture failed: max_num_seqs={seqs} needs more sequences than the "
                    "255 this build's graph pool holds")
    if opts.fault == "hexid" or (opts.fault == "transient" and _draw(Path(opts.state), opts.rate, opts.seed)):
        return _die(f"RuntimeError: NCCL error in: csrc/custom_all_reduce.cuh:368, unhandled cuda error (run with "
                    f"NCCL_DEBUG=INFO for details), handle 0x{secrets.token_hex(6)} at 0x7f{secrets.token_hex(5)}, "
                    f"pid {os.getpid()}")
    from tuner.sim.command import main as sim_main

    return sim_main(rest)


if __name__ == "__main__":
    sys.exit(main())

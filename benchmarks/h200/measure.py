"""Device-side driver of the H200 calibration: the designed trials (tuner.calibrate.design_trials)
through the tuner's own vLLM backend and replayer, rows appended to OUT/measurements.jsonl.

Resumable and time-boxed: each call runs the trials not yet done that fit --budget-s, so the
same command is issued again on the next lease slice. Dry run on any machine, against the
simulated server:

    python benchmarks/h200/measure.py --model /tmp/model --out /tmp/res --budget-s 300 \\
        --vllm-cmd "python -m tuner sim-serve" --extra-args "--speed 4"
"""
from __future__ import annotations

import argparse
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner.backends.vllm import VllmBackend  # noqa: E402
from tuner.calibrate import design_trials, install_sigterm_handler, measure  # noqa: E402
from tuner.serving.config import Deployment  # noqa: E402


def vllm_command() -> str:
    exe = shutil.which("vllm") or str(Path(sys.executable).with_name("vllm"))
    if Path(exe).exists():
        return f"{exe} serve"
    return f"{sys.executable} -m vllm.entrypoints.cli.main serve"


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="model folder (config.json); served with --load-format dummy")
    ap.add_argument("--out", required=True, help="folder for measurements.jsonl and the vLLM logs")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--vllm-version", default="0.26.0")
    ap.add_argument("--vllm-cmd", default=None, help="default: the vllm beside this Python, 'serve'")
    ap.add_argument("--extra-args", default="--load-format dummy")
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--trials", default="", help="comma-separated trial names (default: all)")
    a = ap.parse_args()
    install_sigterm_handler()
    out = Path(a.out)
    cmd = a.vllm_cmd or vllm_command()
    dep = Deployment(model=a.model, gpu=a.gpu, vllm_version=a.vllm_version)
    trials = design_trials(dep)
    if a.trials:
        keep = a.trials.split(",")
        trials = [t for t in trials if t.name in keep]
    backend = VllmBackend(vllm_cmd=cmd, vllm_version=a.vllm_version, log_dir=out / "logs",
                          extra_args=shlex.split(a.extra_args), env={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
                          startup_timeout_s=300.0, stop_grace_s=20.0, timeout_s=300.0,
                          platform="cuda")
    meta = {"gpu": a.gpu, "nvidia_smi": gpu_name(), "vllm_version": a.vllm_version, "vllm_cmd": cmd,
            "extra_args": a.extra_args, "model": a.model, "python": platform.python_version(),
            "host": platform.node(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "design": [{"name": t.name, "config": t.config.to_dict(), "loads": list(t.loads),
                        "expect_refusal": t.expect_refusal, "purpose": t.purpose} for t in trials]}
    print(f"driver: {len(trials)} trials, budget {a.budget_s:.0f} s, cmd {cmd}", flush=True)
    for t in trials:
        print(f"  {t.name}: {t.config.to_dict()} loads={t.loads}", flush=True)
    rows = measure(backend, dep, trials, out, budget_s=a.budget_s, meta=meta)
    done = {r["trial"] for r in rows if r.get("kind") == "trial_end"}
    print(f"driver: done {sorted(done)}; left {[t.name for t in trials if t.name not in done]}", flush=True)


if __name__ == "__main__":
    main()

"""Issue 52's campaign, dry-run on a machine without GPUs: the eight-GPU command lines, the GPU assignment
and the router checked against eight `tuner sim-serve` processes standing in for vLLM (stand_in.sh records
what each was given, then serves as one replica would).

    python benchmarks/h200/multi_gpu/dry_run.py [--out DIR] [--speed 40]

1. The campaign's spaces (space-*.yaml) parse, and every layout they name fits eight GPUs and divides the
   model's 32 heads.
2. `tuner search --backend vllm --gpus 8` over the four layouts (grid, one trial each, no confirmation), with
   stand-ins for `vllm serve`: for each trial the stand-ins started, their CUDA_VISIBLE_DEVICES (TP devices
   each, disjoint, within 0-7), their --tensor-parallel-size, and what the trial measured.
3. `tuner plan --target-ttft 5s` on the search's winner through the same stand-ins: every replica of the
   layout served (the router spread the load) and no server is left running.
Exit 1 when a check fails, naming it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
LAYOUTS = ("tp8x1", "tp4x2", "tp2x4", "tp1x8")
CHECK_SPACE = """\
name: multi-gpu-layouts
description: the four layouts of issue 52 on eight GPUs, one configuration each (dry run).
deployment: {model: llama-2-7b, gpu: H100-SXM, gpus: 8, vllm_version: 0.26.0}
workload: {target_ttft_s: 5s, trace: null, requests: 240, load: concurrency, seed: 0}
parameters: {max_num_seqs: 128, max_model_len: 4096}
layouts: [tp8x1, tp4x2, tp2x4, tp1x8]
"""


def tuner(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, env=env, capture_output=True, text=True)


def check_spaces() -> list[str]:
    from tuner.space import load_space

    problems = []
    for path in sorted(HERE.glob("space-*.yaml")):
        space = load_space(str(path))
        for layout in space.layouts:
            tp, replicas = layout
            if tp * replicas > 8 or 32 % tp:
                problems.append(f"{path.name}: {layout} does not fit 8 GPUs or divide 32 heads")
        print(f"{path.name}: {len(space.layouts)} layouts, parses")
    return problems


def starts(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def check_assignment(records: list[dict]) -> tuple[list[str], list[str]]:
    """Group the stand-ins' starts into trials (consecutive starts of one --tensor-parallel-size whose devices
    are disjoint) and check each against its layout."""
    rows, problems, i = [], [], 0
    while i < len(records):
        tp = int(flag(records[i]["argv"], "--tensor-parallel-size", "1"))
        group = [records[i]]
        while (i + len(group) < len(records) and len(group) < 8 // tp
               and int(flag(records[i + len(group)]["argv"], "--tensor-parallel-size", "1")) == tp):
            group.append(records[i + len(group)])
        devices = [r["cuda_visible_devices"] or "" for r in group]
        sets = [set(d.split(",")) - {""} for d in devices]
        used = set().union(*sets)
        ok = all(len(s) == tp for s in sets) and sum(len(s) for s in sets) == len(used) and used <= set(map(str, range(8)))  # noqa: E501
        if not ok:
            problems.append(f"tp{tp}x{len(group)}: devices {devices} are not {len(group)} disjoint sets of {tp} in 0-7")
        rows.append(f"tp{tp}x{len(group)}: CUDA_VISIBLE_DEVICES {' | '.join(devices)}; --tensor-parallel-size {tp}; "
                    f"ports {', '.join(flag(r['argv'], '--port', '?') for r in group)}")
        i += len(group)
    return rows, problems


def ours_running(log: Path) -> list[int]:
    """Processes of this dry run still alive: those whose environment carries its STAND_IN_LOG (a
    stand-in, the sim-serve it became, anything either started), whatever else runs on the machine."""
    import psutil

    alive = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("STAND_IN_LOG") == str(log):
                alive.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return alive


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="keep the studies and logs here (default: a temporary folder)")
    parser.add_argument("--speed", default="40", help="sim-serve's --speed (times faster than real time)")
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="multi-gpu-dry-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "layouts.yaml").write_text(CHECK_SPACE)
    log = work / "stand-ins.jsonl"
    env = {**os.environ, "STAND_IN_LOG": str(log), "STAND_IN_SPEED": args.speed, "STAND_IN_PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT), "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    cmd = f"bash {HERE / 'stand_in.sh'} {{model}}"
    problems = check_spaces()
    search = tuner("search", "--space", "layouts.yaml", "--backend", "vllm", "--vllm-cmd", cmd, "--gpus", "8",
                   "--sampler", "grid", "--budget", "4", "--confirm", "0", "--no-predict", "--output", "json",
                   cwd=work, env=env)
    if search.returncode != 0:
        problems.append(f"tuner search exit {search.returncode}: {search.stderr.strip()[-600:]}")
    rows, bad = check_assignment(starts(log))
    problems += bad
    print("\n".join(rows))
    seen = {r.split(":")[0] for r in rows}
    problems += [f"layout {lay} never started" for lay in LAYOUTS if lay not in seen]
    before = len(starts(log))
    # the study by name: `--gpus` would describe a configuration of its own (plan refuses --study with it)
    name = json.loads(search.stdout)["study"] if search.returncode == 0 else "?"
    plan = tuner("plan", "--target-ttft", "5s", "--backend", "vllm", "--vllm-cmd", cmd, "--study", name,
                 "--concurrency", "16,64", "--no-files", cwd=work, env=env)
    print(plan.stdout[-1500:])
    if plan.returncode != 0:
        problems.append(f"tuner plan exit {plan.returncode}: {plan.stderr.strip()[-600:]}")
    plan_starts = starts(log)[before:]
    print(f"tuner plan started {len(plan_starts)} stand-in(s): "
          + "; ".join(f"{r['cuda_visible_devices']} port {flag(r['argv'], '--port')}" for r in plan_starts))
    if search.returncode == 0:
        best = json.loads(search.stdout)["best"]["config"]
        tp, replicas = best["tensor_parallel_size"], best["replicas"]
        _, bad = check_assignment(plan_starts)
        if len(plan_starts) != replicas or bad or any(
                int(flag(r["argv"], "--tensor-parallel-size", "1")) != tp for r in plan_starts):
            problems.append(f"tuner plan started {len(plan_starts)} server(s), not the winner's tp{tp}x{replicas}")
    left = ours_running(log)
    if left:
        problems.append(f"{len(left)} sim-serve process(es) left running")
    for p in problems:
        print(f"FAILED: {p}")
    print(f"dry run in {work}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

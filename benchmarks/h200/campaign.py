"""The second H200 calibration campaign: workload shapes and model shapes beyond the first
campaign's one closed-loop shape (see README.md beside this file).

    python benchmarks/h200/campaign.py plan                 # the design, with time estimates
    python benchmarks/h200/campaign.py prepare [.campaign]  # plan.json + trace rows for the device
    python benchmarks/h200/campaign.py run --out DIR --budget-s S [--vllm-cmd CMD]   # on the device
    python benchmarks/h200/campaign.py dry-run --out /tmp/c  # the whole thing against tuner sim-serve

Trials (one vLLM start each) and their probes (a workload reference of tuner.calibrate.probes and a
load), most informative first so that a lease cut short still holds the anchors:

* ``q7-base``: Qwen2.5-7B shape, vLLM's defaults at gmu 0.9 with max-model-len 32768: the
  built-in mix at 1/64/256 users, prefill-heavy (prompts ~2,100, outputs ~24) at 16/64,
  decode-heavy at 64/256, 16k-30k-token prompts at 2 users, Poisson and gamma(0.25) arrivals
  near saturation, the Azure conversation trace's own timestamps compressed 8x, and
  Mooncake requests that share prefixes, replayed as they are and with the prefixes made
  unique (prefix caching's benefit on the same server).
* ``q32-base``: Qwen2.5-32B shape (dense, 64 layers, 65 GB of weights).
* ``moe-base``: Qwen3-30B-A3B shape (MoE: 128 experts, 8 active).
* ``q7-mbt2048``: max-num-batched-tokens 2048 against the default 8192 (the crossover at 64
  and 256 users, and prefill-heavy traffic).
* ``q7-fp8``: fp8 KV cache.

Resumable: a call runs the probes not yet measured that fit its budget (a trial's probes
resume across calls, re-starting vLLM once); rows go to DIR/measurements.jsonl as in the
first campaign (tuner.calibrate.measure).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tuner.calibrate import Probe, Trial, measure  # noqa: E402
from tuner.calibrate.probes import cache_workload, ref_of, trace_ref  # noqa: E402
from tuner.serving.config import Deployment, ServeConfig  # noqa: E402

VLLM_VERSION = "0.26.0"
MODELS = {"q7": "qwen2.5-7b", "q32": "qwen2.5-32b", "moe": "qwen3-30b-a3b", "l8": "llama-3.1-8b",
          "nemo": "mistral-nemo-12b"}


def c(users: int) -> dict:
    return {"kind": "concurrency", "users": users}


def plan() -> list[Trial]:
    """The campaign's trials, in the order they run."""
    mooncake = trace_ref("mooncake_fast25_synthetic", (0, 64), max_tokens=32000, groups=4)
    azure = trace_ref("azure_llm_2023_conv", (0, 400))
    q7 = ServeConfig(gpu_memory_utilization=0.9, max_model_len=32768)
    short = ServeConfig(gpu_memory_utilization=0.9, max_model_len=8192)
    return [
        Trial("q7-base", q7, model=MODELS["q7"], start_s=110, purpose="workload shapes on vLLM's defaults", probes=(
            Probe(ref_of("mix", 5, seed=11), c(1), 9),
            Probe(ref_of("mix", 256, seed=12), c(64), 15),
            Probe(ref_of("mix", 512, seed=13), c(256), 17),
            Probe(ref_of("prefill", 96, seed=14), c(16), 8),
            Probe(ref_of("prefill", 256, seed=15), c(64), 15),
            Probe(ref_of("decode", 128, seed=16), c(64), 12),
            Probe(ref_of("decode", 384, seed=17), c(256), 14),
            Probe(ref_of("long", 6, seed=18), c(2), 9),
            Probe(ref_of("mix", 300, seed=19), {"kind": "poisson", "rate": 32.0, "burstiness": 1.0, "seed": 1}, 14),
            Probe(ref_of("mix", 300, seed=19), {"kind": "poisson", "rate": 32.0, "burstiness": 0.25, "seed": 1}, 14),
            Probe(azure, {"kind": "trace", "multiplier": 8.0}, 20),
            Probe(mooncake, c(8), 22),
            Probe({**mooncake, "unique_prefixes": True}, c(8), 24),
        )),
        Trial("q32-base", short, model=MODELS["q32"], start_s=170, purpose="a dense 32B shape", probes=(
            Probe(ref_of("mix", 2, seed=21), c(1), 14),
            Probe(ref_of("mix", 128, seed=22), c(64), 28),
            Probe(ref_of("mix", 256, seed=23), c(128), 38),
            Probe(ref_of("prefill", 64, seed=24), c(16), 14),
            Probe(ref_of("decode", 64, seed=25), c(64), 18),
        )),
        Trial("moe-base", short, model=MODELS["moe"], start_s=170, purpose="an MoE shape (8 of 128 experts)", probes=(
            Probe(ref_of("mix", 4, seed=31), c(1), 12),
            Probe(ref_of("mix", 192, seed=32), c(64), 22),
            Probe(ref_of("mix", 512, seed=33), c(256), 25),
            Probe(ref_of("prefill", 96, seed=34), c(16), 8),
            Probe(ref_of("decode", 96, seed=35), c(64), 16),
        )),
        Trial("q7-mbt2048", short.replace(max_num_batched_tokens=2048), model=MODELS["q7"], start_s=140,
              purpose="2048-token chunks against the default 8192", probes=(
                  Probe(ref_of("mix", 256, seed=12), c(64), 15),
                  Probe(ref_of("mix", 512, seed=13), c(256), 17),
                  Probe(ref_of("prefill", 96, seed=14), c(16), 9),
                  Probe(ref_of("prefill", 256, seed=15), c(64), 16),
              )),
        Trial("q7-fp8", q7.replace(kv_cache_dtype="fp8"), model=MODELS["q7"], start_s=150,
              purpose="fp8 KV cache", probes=(
                  Probe(ref_of("mix", 5, seed=11), c(1), 9),
                  Probe(ref_of("mix", 512, seed=13), c(256), 17),
                  Probe(ref_of("decode", 384, seed=17), c(256), 14),
                  Probe(ref_of("long", 6, seed=18), c(2), 9),
              )),
        Trial("q7-base-again", q7, model=MODELS["q7"], start_s=150,
              purpose="q7-base started again: run-to-run noise of a fresh start", probes=(
                  Probe(ref_of("mix", 256, seed=12), c(64), 15),
                  Probe(ref_of("mix", 512, seed=13), c(256), 19),
                  Probe(ref_of("prefill", 256, seed=15), c(64), 15),
                  Probe(ref_of("decode", 384, seed=17), c(256), 20),
                  Probe(ref_of("mix", 300, seed=19), {"kind": "poisson", "rate": 32.0, "burstiness": 0.25, "seed": 1},
                        15),
              )),
    ]


def plan3() -> list[Trial]:
    """Campaign 3: two architectures no earlier campaign measured, held back whole from the
    fit (Llama-3.1-8B shape: 32 heads, 8 KV heads, 128k vocabulary; Mistral-Nemo-12B shape:
    40 layers, head dim 128 unlike hidden/heads, 8 KV heads): closed loop at 1/64/256/512 users
    on uniform (128-1024 / 32-256 tokens) and mixed lengths, Poisson arrivals, Mooncake's
    shared prefixes as they are and made unique, and Llama's start on both sides of the
    refusal at max-model-len 32768 (the simulator puts the edge between gmu 0.14 and 0.15)."""
    mooncake = trace_ref("mooncake_fast25_synthetic", (0, 64), max_tokens=32000, groups=4)
    cfg = ServeConfig(gpu_memory_utilization=0.9, max_model_len=32768)

    def shapes(seed: int, slow: float) -> tuple[Probe, ...]:
        return (
            Probe(ref_of("uniform", 8, seed=seed), c(1), 10 * slow),
            Probe(ref_of("mix", 5, seed=seed + 1), c(1), 9 * slow),
            Probe(ref_of("uniform", 256, seed=seed + 2), c(64), 12 * slow),
            Probe(ref_of("mix", 256, seed=seed + 3), c(64), 15 * slow),
            Probe(ref_of("uniform", 512, seed=seed + 4), c(256), 14 * slow),
            Probe(ref_of("mix", 512, seed=seed + 5), c(256), 17 * slow),
            Probe(ref_of("uniform", 1024, seed=seed + 6), c(512), 20 * slow),
            Probe(ref_of("mix", 1024, seed=seed + 7), c(512), 28 * slow),
            Probe(ref_of("mix", 300, seed=seed + 8), {"kind": "poisson", "rate": 24.0, "burstiness": 1.0, "seed": 1},
                  16 * slow),
            Probe(mooncake, c(8), 22 * slow),
            Probe({**mooncake, "unique_prefixes": True}, c(8), 24 * slow),
        )

    return [
        Trial("l8-base", cfg, model=MODELS["l8"], start_s=120, purpose="Llama-3.1-8B shape, never fitted",
              probes=shapes(41, 1.0)),
        Trial("nemo-base", cfg, model=MODELS["nemo"], start_s=150, purpose="Mistral-Nemo-12B shape, never fitted",
              probes=shapes(51, 1.5)),
        Trial("l8-gmu015", cfg.replace(gpu_memory_utilization=0.15), model=MODELS["l8"], start_s=110,
              purpose="just above the refusal: KV size near the edge, KV-limited load", probes=(
                  Probe(ref_of("uniform", 8, seed=61), c(1), 10),
                  Probe(ref_of("uniform", 256, seed=62), c(64), 20),
              )),
        Trial("l8-gmu014", cfg.replace(gpu_memory_utilization=0.14), model=MODELS["l8"], start_s=90,
              purpose="just below: refused, vLLM's estimated maximum model length", expect_refusal=True),
    ]


def plan4() -> list[Trial]:
    """Campaign 4 (issue 30): repeat what the fidelity gate cannot tell from noise, and re-measure
    what a campaign got wrong. The MoE shape with a warm-up first (campaign 2's first MoE probes
    ran while Triton JIT-compiled fused_moe kernels: "Triton kernel JIT compilation during
    inference"); eager starts two and three times, a graph start between them (three starts of
    one 1-user eager probe gave TPOT 11.1, 13.7, 16.2 ms); the decode-heavy 256-user probe twice
    on one start (two starts gave 14,315 and 19,282 tokens/s); the Nemo shape on a model folder
    that keeps the preset's "sliding_window": null (campaign 3's ran every layer windowed at 4096);
    and the refusal campaign 3 did not reach. The probes named ``warm`` are a warm-up, not data:
    list them in excluded_points.txt. make_models keeps a folder that exists: on a device that
    kept campaign 3's, delete /root/models/mistral-nemo-12b first."""
    short = ServeConfig(gpu_memory_utilization=0.9, max_model_len=8192)
    q7 = ServeConfig(gpu_memory_utilization=0.9, max_model_len=32768)
    eager = ServeConfig(gpu_memory_utilization=0.9, max_model_len=4096, enforce_eager=True)
    eager128 = eager.replace(gpu_memory_utilization=0.7, max_num_seqs=128, max_num_batched_tokens=512)

    def eager_probes(seed: int) -> tuple[Probe, ...]:
        return (Probe(ref_of("uniform", 5, seed=seed), c(1), 12), Probe(ref_of("uniform", 128, seed=seed + 1), c(32), 14),  # noqa: E501
                Probe(ref_of("uniform", 1024, seed=seed + 2), c(512), 26))

    return [
        Trial("moe-warm", short, model=MODELS["moe"], start_s=170, purpose="MoE after a warm-up of every shape", probes=(  # noqa: E501
            Probe(ref_of("mix", 64, seed=71), c(64), 10),      # warm
            Probe(ref_of("mix", 128, seed=72), c(256), 12),    # warm
            Probe(ref_of("prefill", 48, seed=73), c(16), 6),   # warm
            Probe(ref_of("mix", 4, seed=31), c(1), 12),
            Probe(ref_of("mix", 192, seed=32), c(64), 22),
            Probe(ref_of("mix", 512, seed=33), c(256), 25),
        )),
        Trial("eager-r1", eager, model=MODELS["q7"], start_s=70, purpose="eager, again", probes=eager_probes(81)),
        Trial("q7-decode-r", q7, model=MODELS["q7"], start_s=110, purpose="decode-heavy at 256 users twice", probes=(
            Probe(ref_of("decode", 384, seed=17), c(256), 20),  # a third start of campaign 2's probe
            Probe(ref_of("uniform", 128, seed=82), c(32), 8),   # the graph twin of the eager 32-user probe
        )),
        Trial("eager-r2", eager, model=MODELS["q7"], start_s=70, purpose="eager, a third start", probes=eager_probes(81)),  # noqa: E501
        Trial("eager128-r", eager128, model=MODELS["q7"], start_s=70, purpose="eager at 128 seqs / 512 tokens, again",
              probes=(Probe(ref_of("uniform", 5, seed=81), c(1), 12), Probe(ref_of("uniform", 128, seed=82), c(32), 14),
                      Probe(ref_of("uniform", 384, seed=85), c(192), 16))),
        Trial("nemo-fixed", q7, model=MODELS["nemo"], start_s=150,
              purpose="Nemo without the stray window: its KV log line is the pool", probes=(
                  Probe(ref_of("uniform", 8, seed=51), c(1), 15),
                  Probe(ref_of("mix", 256, seed=54), c(64), 22),
              )),
        Trial("l8-gmu014", q7.replace(gpu_memory_utilization=0.14), model=MODELS["l8"], start_s=90,
              purpose="refused: vLLM's estimated maximum model length on a second shape", expect_refusal=True),
    ]


def plan5() -> list[Trial]:
    """Campaign 5 (issue 30): the MoE shape at small batches, where a 1-user step took 4.09 ms
    and the simulator's bytes give 2.66 ms. Decode-heavy closed loops (prompts 64-256, outputs
    384-768 tokens, so TPOT is nearly all decode steps of the named batch) at 1, 2, 4, 8, 16 and
    32 users on the Qwen3-30B-A3B shape of campaign 4's ``moe-warm`` (gmu 0.9, max-model-len
    8192), after warm-up probes (Triton JIT-compiles fused_moe kernels on first use of a batch
    shape: a 32-user round whose tail drains the batch from 32 to 1, then one short round at each
    measured size, and campaign 4's mixed warm-up); campaign 2's MoE mix x4 @ 1 once more; then
    the same decode loads on the Qwen2.5-7B shape (dense, no expert kernels) as the control that
    separates the MoE path's cost from the host's; and the MoE start again (replicate noise).
    The probes named ``warm`` are a warm-up, not data: list them in excluded_points.txt."""
    short = ServeConfig(gpu_memory_utilization=0.9, max_model_len=8192)
    sizes = (1, 2, 4, 8, 16, 32)

    def ladder(seed: int, slow: float) -> tuple[Probe, ...]:
        return tuple(Probe(ref_of("decode", max(3, 2 * u), seed=seed + i), c(u), (6 + u / 8) * slow)
                     for i, u in enumerate(sizes))

    def warm(seed: int) -> tuple[Probe, ...]:
        return (Probe(ref_of("decode", 48, seed=seed), c(32), 7),                     # warm
                *(Probe(ref_of("decode", u, seed=seed + 1 + i), c(u), 3) for i, u in enumerate(sizes)),  # warm
                Probe(ref_of("mix", 64, seed=71), c(64), 10))                          # warm

    return [
        Trial("moe-small", short, model=MODELS["moe"], start_s=170, purpose="MoE decode at 1-32 users, warm",
              probes=(*warm(90), *ladder(100, 1.0), Probe(ref_of("mix", 4, seed=31), c(1), 12))),
        Trial("q7-small", short, model=MODELS["q7"], start_s=100, purpose="dense control: the same decode loads",
              probes=(Probe(ref_of("decode", 48, seed=90), c(32), 6), *ladder(100, 1.2))),  # first: warm
        Trial("moe-small-again", short, model=MODELS["moe"], start_s=170, purpose="moe-small started again",
              probes=(*warm(90), *ladder(100, 1.0))),
    ]


def plan6() -> list[Trial]:
    """Campaign 6 (issue 30): the starts campaign 4 could not measure (its stream check stopped
    the 256-user decode probe; 2f5f142 fixed the check), for the groups leave-one-shape-out
    puts past 8 %: the 7B decode-heavy probe at 256 users (two starts gave 14,315 and 19,282
    tokens/s: is one of them the outlier, or do starts spread that wide?), measured twice on
    each of two fresh starts (within a start against between starts); and the 7B eager probes
    at 1 and 32 users (four starts gave TPOT 11.1-22.7 ms) on three more starts; and the decode
    probes with ``--api-server-count 4``: the simulator says one API server's per-token work caps
    the 256-user decode (what a host's CPU does to it would then be the starts' spread).
    Interleaved so that a call cut short still has one start of each."""
    q7 = ServeConfig(gpu_memory_utilization=0.9, max_model_len=32768)
    eager = ServeConfig(gpu_memory_utilization=0.9, max_model_len=4096, enforce_eager=True)
    eager128 = eager.replace(gpu_memory_utilization=0.7, max_num_seqs=128, max_num_batched_tokens=512)

    def decode(name: str, config: ServeConfig = q7, purpose: str = "decode-heavy at 256 users, twice on one start") -> Trial:  # noqa: E501
        return Trial(name, config, model=MODELS["q7"], start_s=110, purpose=purpose,
                     probes=(Probe(ref_of("uniform", 128, seed=82), c(32), 8),   # the graph twin of the eager 32-user probe  # noqa: E501
                             Probe(ref_of("decode", 384, seed=17), c(256), 20),   # campaign 2's probe
                             Probe(ref_of("mix", 512, seed=13), c(256), 17),      # campaign 2's mix at 256 users
                             Probe(ref_of("decode", 320, seed=18), c(256), 18)))  # again on this start, other requests

    def eager_probes(seed: int) -> tuple[Probe, ...]:
        return (Probe(ref_of("uniform", 5, seed=seed), c(1), 12), Probe(ref_of("uniform", 128, seed=seed + 1), c(32), 14))  # noqa: E501

    return [
        decode("q7-decode-r"),
        # the simulator puts 256 decode-heavy users on one API server at its per-token cost (72 us a token,
        # fitted): four processes share that work; the same probes on the same host say whether it is so
        decode("q7-api4", q7.replace(api_server_count=4), "the same probes with --api-server-count 4"),
        Trial("eager-r2", eager, model=MODELS["q7"], start_s=70, purpose="eager, a fifth start", probes=eager_probes(81)),  # noqa: E501
        decode("q7-decode-r2"),
        Trial("eager128-r", eager128, model=MODELS["q7"], start_s=70, purpose="eager at 128 seqs / 512 tokens, again",
              probes=eager_probes(81)),
        Trial("eager-r3", eager, model=MODELS["q7"], start_s=70, purpose="eager, a sixth start", probes=eager_probes(81)),  # noqa: E501
    ]


PLANS = {"2": plan, "3": plan3, "4": plan4, "5": plan5, "6": plan6}


def estimate(trials: list[Trial]) -> float:
    return sum((t.start_s or 105) + sum(p.expected_s for p in t.probes) for t in trials)


def write_plan(trials: list[Trial], folder: Path, campaign: int | None = None) -> Path:
    """plan.json (the campaign's number and its trials as JSON) and the trace rows their
    probes need, for the device. The number stamps every row the run writes: two plans may
    share trial names (plan 4's and 6's ``q7-decode-r``), so a run cannot tell it from them."""
    folder.mkdir(parents=True, exist_ok=True)
    for t in trials:
        for p in t.probes:
            if p.workload.get("kind") == "trace":
                cache_workload(p.workload, folder / "workloads")
    doc = [{"name": t.name, "config": t.config.to_dict(), "model": t.model, "start_s": t.start_s,
            "purpose": t.purpose, "expect_refusal": t.expect_refusal, "probes": [{"workload": p.workload, "load": p.load, "expected_s": p.expected_s}  # noqa: E501
                                             for p in t.probes]} for t in trials]
    path = folder / "plan.json"
    path.write_text(json.dumps({"campaign": campaign, "trials": doc}, indent=1))
    return path


def read_plan(path: Path) -> tuple[int | None, list[Trial]]:
    """The campaign's number (None in a plan written before plans carried it: a bare list)
    and its trials."""
    data = json.loads(path.read_text())
    number, doc = (None, data) if isinstance(data, list) else (data.get("campaign"), data["trials"])
    return number, [Trial(d["name"], ServeConfig.from_dict(d["config"]), model=d["model"], start_s=d["start_s"],
                          purpose=d["purpose"], expect_refusal=d.get("expect_refusal", False),
                          probes=tuple(Probe(p["workload"], p["load"], p["expected_s"]) for p in d["probes"]))
                    for d in doc]


def make_models(root: Path, kit: Path, presets: set[str]) -> dict[str, Path]:
    """Weight-less model folders (config.json of tuner's preset, the kit's synthetic
    byte-level tokenizer sized to the vocabulary) for ``--load-format dummy``."""
    out = {}
    for preset in sorted(presets):
        folder = root / preset
        out[preset] = folder
        if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
            continue
        cfg = json.loads((ROOT / "tuner" / "data" / "models" / preset / "config.json").read_text())
        vocab = int(cfg["vocab_size"])
        subprocess.run([sys.executable, str(kit / "make_model.py"), str(folder),
                        "--tokenizer-size", str(min(vocab, 152064))], check=True)
        base = json.loads((folder / "config.json").read_text())  # the kit's Qwen2.5-7B config, eos ids set
        merged = {**base, **{k: v for k, v in cfg.items() if not k.startswith("_")}}
        # the kit's Qwen window keys mean nothing to another architecture; a window the preset
        # states (Nemo's "sliding_window": null) stays, or transformers' MistralConfig default
        # (4096) applies: campaign 3's Nemo start ran every layer windowed that way
        for key in ("max_window_layers", "use_sliding_window", "sliding_window"):
            if cfg.get("model_type") != "qwen2" and key not in cfg:
                merged.pop(key, None)
        if cfg.get("model_type") == "qwen3_moe":
            merged.setdefault("decoder_sparse_step", 1)
            merged.setdefault("mlp_only_layers", [])
            merged.setdefault("norm_topk_prob", True)
            merged.setdefault("output_router_logits", False)
        (folder / "config.json").write_text(json.dumps(merged, indent=2))
    return out


def _cpu_model() -> str:
    """The host CPU (eager-mode and streaming costs are the host's: a start on another host
    is told apart by it)."""
    try:
        return next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def vllm_command() -> str:
    exe = shutil.which("vllm") or str(Path(sys.executable).with_name("vllm"))
    return f"{exe} serve" if Path(exe).exists() else f"{sys.executable} -m vllm.entrypoints.cli.main serve"


def run(args: argparse.Namespace, *, dry: bool = False) -> None:
    from tuner.backends.vllm import VllmBackend
    from tuner.calibrate import install_sigterm_handler

    install_sigterm_handler()
    out = Path(args.out)
    number, trials = read_plan(Path(args.plan)) if args.plan else (int(args.campaign), PLANS[args.campaign]())
    if args.trials:
        keep = args.trials.split(",")
        trials = [t for t in trials if t.name in keep]
    if dry:
        models = {p: Path(p) for p in {t.model for t in trials}}  # presets: sim-serve reads them by name
        cmd = args.vllm_cmd or f"{sys.executable} -m tuner sim-serve --speed {args.speed:g}"
        extra: list[str] = []
    else:
        models = make_models(Path(args.models), Path(args.kit), {t.model for t in trials})
        cmd = args.vllm_cmd or vllm_command()
        extra = ["--load-format", "dummy"]
    backend = VllmBackend(vllm_cmd=cmd, vllm_version=VLLM_VERSION, log_dir=out / "logs", extra_args=extra,
                          env={"VLLM_USE_FLASHINFER_SAMPLER": "0"}, startup_timeout_s=400.0, stop_grace_s=20.0,
                          timeout_s=300.0, platform="cuda")

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else ""
    gpu = "H100-SXM" if "H100" in smi else "H200"  # the device machine may lend an H100 for an H200

    def deployment_for(trial: Trial) -> Deployment:
        return Deployment(model=str(models[trial.model]), gpu=gpu, vllm_version=VLLM_VERSION)

    meta = {"campaign": number if number is not None else int(args.campaign), "gpu": gpu, "nvidia_smi": smi, "vllm_version": VLLM_VERSION, "vllm_cmd": cmd,  # noqa: E501
            "extra_args": shlex.join(extra), "python": platform.python_version(), "host": platform.node(),
            "cpu": _cpu_model(), "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dry_run": dry,
            "design": [{"name": t.name, "model": t.model, "config": t.config.to_dict(), "purpose": t.purpose,
                        "probes": [p.label for p in t.probes]} for t in trials]}
    print(f"campaign: {len(trials)} trials, ~{estimate(trials):.0f} s in all, budget {args.budget_s:.0f} s", flush=True)
    rows = measure(backend, deployment_for(trials[0]), trials, out, budget_s=args.budget_s, meta=meta,
                   deployment_for=deployment_for)
    done = {r["trial"] for r in rows if r.get("kind") == "trial_end"}
    print(f"campaign: done {sorted(done)}; left {[t.name for t in trials if t.name not in done]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan")
    prep = sub.add_parser("prepare")
    prep.add_argument("folder", nargs="?", default=str(ROOT / ".campaign"))
    for p in (pl, prep):
        p.add_argument("--campaign", choices=sorted(PLANS), default="2")
    for name in ("run", "dry-run"):
        r = sub.add_parser(name)
        r.add_argument("--out", required=True)
        r.add_argument("--budget-s", type=float, default=540.0)
        r.add_argument("--plan", default=None, help="plan.json written by prepare (default: plan())")
        r.add_argument("--trials", default="")
        r.add_argument("--campaign", choices=sorted(PLANS), default="2",
                       help="without --plan: which design; with a plan that carries no number: the number its rows get")
        r.add_argument("--vllm-cmd", default=None)
        r.add_argument("--models", default="/root/models")
        r.add_argument("--kit", default="/root/kit/p6")
        r.add_argument("--speed", type=float, default=20.0, help="dry-run: sim-serve's speed")
    a = ap.parse_args()
    if a.cmd == "plan":
        trials = PLANS[a.campaign]()
        for t in trials:
            print(f"{t.name:11s} {t.model:14s} start ~{t.start_s:.0f} s  {t.purpose}")
            for p in t.probes:
                print(f"    ~{p.expected_s:3.0f} s  {p.label}")
        print(f"in all ~{estimate(trials):.0f} s of device time for starts and replays")
    elif a.cmd == "prepare":
        print(write_plan(PLANS[a.campaign](), Path(a.folder), int(a.campaign)))
    else:
        if a.cmd == "run" and os.environ.get("TUNER_WORKLOAD_CACHE") is None and a.plan:
            os.environ["TUNER_WORKLOAD_CACHE"] = str(Path(a.plan).parent / "workloads")
        run(a, dry=a.cmd == "dry-run")


if __name__ == "__main__":
    main()

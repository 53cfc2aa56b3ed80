"""The vLLM launcher, end to end against `tuner sim-serve` (real processes and sockets),
plus argv rendering and failure classification on vLLM's own wording."""
from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from tuner.backends import get_backend
from tuner.backends.vllm import VllmBackend
from tuner.backends.vllm_args import classify_failure, parse_startup, render_flags
from tuner.backends.vllm_command import detect_version
from tuner.core.errors import ConfigRejected, Disrupted, EnvironmentFault
from tuner.core.versions import parse_version
from tuner.runtime.processes import group_alive
from tuner.serving.config import Deployment, ServeConfig
from tuner.serving.load import Concurrency
from tuner.sim.command import build_parser
from tuner.sim.memory import plan_memory
from tuner.traffic.workload import Workload

SIM = f"{sys.executable} -m tuner.sim.server --speed 20"
DEP = Deployment(model="qwen2.5-7b", gpu="H100-SXM")


pytestmark = pytest.mark.usefixtures("no_leftover_processes")  # tests/conftest.py


@pytest.fixture
def backend(tmp_path):
    return VllmBackend(vllm_cmd=SIM, log_dir=tmp_path / "logs", startup_timeout_s=60, stop_grace_s=5)


def _workload(n: int = 40) -> Workload:
    rng = np.random.default_rng(0)
    return Workload(arrival_s=np.zeros(n), prompt_tokens=rng.integers(50, 800, n),
                    output_tokens=rng.integers(5, 60, n))


# -- argv ----------------------------------------------------------------------------------

def test_flags_follow_the_vllm_version():
    cfg = ServeConfig(enable_prefix_caching=False, max_num_seqs=64, gpu_memory_utilization=0.85)
    old = render_flags(DEP, cfg, "0.6.3.post1", host="127.0.0.1", port=8000)
    new = render_flags(DEP, cfg, "0.26.0", host="127.0.0.1", port=8000)
    assert "--disable-log-requests" in old and "--disable-log-requests" not in new
    assert "--no-enable-prefix-caching" in new
    assert not any("prefix" in f for f in old)  # 0.6: off by default, no way to say "off"
    assert new[new.index("--gpu-memory-utilization") + 1] == "0.85"
    assert "--max-model-len" not in new  # None: vLLM's default


def test_rendered_flags_parse_as_vllm_serve_flags():
    cfg = ServeConfig(gpu_memory_utilization=0.9, max_num_seqs=128, max_model_len=4096, block_size=32,
                      max_num_batched_tokens=4096, enforce_eager=True, kv_cache_dtype="fp8",
                      tensor_parallel_size=2)
    dep = Deployment(model="qwen2.5-7b", gpu_count=2, dtype="float16", quantization="awq")
    args = build_parser().parse_args(["m"] + render_flags(dep, cfg, "0.26.0", host="127.0.0.1", port=1234))
    assert (args.port, args.max_num_seqs, args.block_size, args.kv_cache_dtype) == (1234, 128, 32, "fp8")
    assert args.tensor_parallel_size == 2 and args.enforce_eager and args.quantization == "awq"
    assert args.enable_prefix_caching is True and args.dtype == "float16"


def test_versions_read_like_vllm_writes_them():
    assert parse_version("0.6.3.post1") == (0, 6, 3)
    assert parse_version("0.11.0rc2+cu128") == (0, 11, 0)
    assert parse_version("v0.8") == (0, 8, 0)


def test_version_is_asked_from_the_python_beside_vllm(tmp_path, monkeypatch):
    bin_dir, pkg = tmp_path / "bin", tmp_path / "site" / "vllm"
    bin_dir.mkdir()
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.6.3.post1'\n")
    os.symlink(sys.executable, bin_dir / "python")
    (bin_dir / "vllm").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "vllm").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    assert detect_version(f"{bin_dir / 'vllm'} serve") == "0.6.3.post1"
    assert detect_version("docker run --rm vllm/vllm-openai") is None


def test_layout_needs_tp_times_replicas_gpus(backend):
    dep = Deployment(model="qwen2.5-7b", gpu_count=4, gpu_ids=(2, 3, 5, 7))
    assert backend.layout(dep, ServeConfig(tensor_parallel_size=2, replicas=2)) == ["2,3", "5,7"]
    with pytest.raises(ConfigRejected) as err:
        backend.precheck(dep, ServeConfig(tensor_parallel_size=2, replicas=3))
    assert err.value.kind == "layout" and "needs 6 GPUs, 4 given" in err.value.message


def test_model_placeholder_in_the_command(tmp_path):
    b = VllmBackend(vllm_cmd="docker run --rm img --model {model}", log_dir=tmp_path)
    argv = b.argv(DEP, ServeConfig(), port=9, version="0.26.0")
    assert argv[:5] == ["docker", "run", "--rm", "img", "--model"] and argv[5] == "qwen2.5-7b"
    assert argv[6:8] == ["--host", "127.0.0.1"]


# -- failure classification on vLLM's wording (shared/reference/vllm-facts.md) -------------

LOG_PREFIX = "(EngineCore_DP0 pid=123) ERROR 11-30 01:02:03 [core.py:708] "


@pytest.mark.parametrize("line, kind", [
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
     "when initializing the engine.", "no_kv_memory"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "oom"),
    ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla "
     "V100-SXM2-32GB GPU has compute capability 7.0.", "dtype"),
    ("ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 75. "
     "Current capability: 70.", "quantization"),
    ("ValueError: Total number of attention heads (28) must be divisible by tensor parallel size (8).",
     "tensor_parallel"),
    ("ValueError: max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512).",
     "batch_tokens"),
])
def test_failures_are_classified_with_vllms_line(line, kind):
    log = "INFO loading weights\n" + LOG_PREFIX + "EngineCore failed to start.\n" + line + "\n"
    err = classify_failure(1, log, log_path="x.log")
    assert err.kind == kind
    assert line.endswith(err.message) and len(err.message) > 40  # vLLM's sentence, whole
    assert not err.message.startswith(("ValueError", "torch."))  # without the exception type
    assert err.log_path == "x.log"


@pytest.mark.parametrize("line, kind, retry", [
    ("OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use",
     "port_in_use", True),
    ("OSError: [Errno 28] No space left on device", "disk_full", False),
    ("vllm serve: error: unrecognized arguments: --disable-log-requests", "bad_flag", False),
    ("ModuleNotFoundError: No module named 'vllm'", "command", False),
])
def test_faults_of_the_machine_are_environment_faults_not_refusals(line, kind, retry):
    err = classify_failure(1, "INFO loading weights\n" + LOG_PREFIX + line + "\n", log_path="x.log")
    assert isinstance(err, EnvironmentFault) and not isinstance(err, ConfigRejected)
    assert err.kind == kind and err.retry is retry
    assert line.split(": ", 1)[-1] in err.message and "x.log" in err.message


def test_max_model_len_refusal_carries_vllms_estimate():
    line = ("ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV "
            "cache is needed, which is larger than the available KV cache memory (6.2 GiB). Based on the "
            "available memory, the estimated maximum model length is 50768. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
    err = classify_failure(1, f"{LOG_PREFIX}boom\n{line}\n")
    assert err.kind == "max_model_len" and err.estimated_max_model_len == 50768


LOADING = "(VllmWorker rank=0 pid=9) INFO 11-30 01:02:03 [gpu_model_runner.py:1] Starting to load model m...\n"


def test_an_unknown_death_after_the_engine_started_is_the_configurations_crash_and_silence_a_timeout():
    crash = classify_failure(-6, LOADING + "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert isinstance(crash, ConfigRejected) and crash.kind == "crash"
    assert "signal 6" in crash.message and "illegal memory access" in crash.message
    assert classify_failure(1, LOADING + "RuntimeError: boom\n").kind == "crash"
    assert classify_failure(None, "INFO Loading safetensors shards\n").kind == "timeout"


# vLLM 0.26's own refusal of flags before the model (vllm/utils/argparse_utils.py), exit 1
POSITIONAL = ("Traceback (most recent call last):\n  File \"/venv/bin/vllm\", line 10, in <module>\n"
              "ValueError: `model` should be provided as the first positional argument when using `vllm serve`. "
              "i.e. `vllm serve <model> --<arg> <value>`.\n")


@pytest.mark.parametrize("log", [
    POSITIONAL,
    "INFO 11-30 01:02:03 [api_server.py:1] vLLM API server version 0.26.0\nRuntimeError: NCCL error: unhandled "
    "system error\n",
    "OSError: qwen/nope is not a local folder and is not a valid model identifier listed on "
    "'https://huggingface.co/models'\n",
    "RuntimeError: No CUDA GPUs are available\n",
])
def test_a_death_before_the_engine_started_is_the_environments_whatever_it_says(log):
    err = classify_failure(1, log, log_path="x.log")
    assert isinstance(err, EnvironmentFault) and err.kind == "before_engine", err
    assert "before vLLM's engine started" in err.message and "x.log" in err.message and "\n" not in err.message


def test_a_death_before_the_engine_that_names_a_knob_is_the_configurations():
    line = ("ValueError: User-specified max_model_len (200000) is greater than the derived max_model_len "
            "(max_position_embeddings=32768 or model_max_length=None in model's config.json).")
    assert classify_failure(1, line + "\n").kind == "max_model_len"
    odd = classify_failure(1, "ValueError: max_num_seqs must be positive here\n")
    assert isinstance(odd, ConfigRejected) and odd.kind == "crash"


@pytest.mark.parametrize("code", [-9, -15, 137, 143])
def test_a_server_killed_by_a_signal_tuner_did_not_send_is_the_environments(code):
    err = classify_failure(code, LOADING + "INFO 11-30 01:02:04 [core.py:2] running\n")
    assert isinstance(err, EnvironmentFault) and err.kind == "killed" and "tuner did not send" in err.message


def test_gpu_memory_other_processes_hold_is_the_environments_not_an_oom():
    line = ("ValueError: Free memory on device cuda:0 (30.1/139.8 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 125.8 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
            "processes.")
    err = classify_failure(1, LOG_PREFIX + line + "\n")
    assert isinstance(err, EnvironmentFault) and err.kind == "gpu_busy" and "30.1/139.8 GiB" in err.message


@pytest.mark.parametrize("cmd, model_at", [
    ("vllm serve --load-format dummy", 2),
    ("/opt/venv/bin/vllm serve --load-format dummy --trust-remote-code", 2),
    ("vllm serve", 2),
    ("env A=1 vllm serve --enforce-eager", 4),
    ("python -m vllm.entrypoints.cli.main serve --load-format dummy", 4),
])
def test_the_model_follows_serve_and_the_users_flags_follow_it(tmp_path, cmd, model_at):
    argv = VllmBackend(vllm_cmd=cmd, log_dir=tmp_path).argv(DEP, ServeConfig(), port=9, version="0.26.0", token="t")
    assert argv[model_at - 1] == "serve" and argv[model_at] == "qwen2.5-7b"
    user = cmd.split()[model_at:]
    assert argv[model_at + 1:model_at + 1 + len(user)] == user  # the user's flags, right after the model
    assert argv.count("qwen2.5-7b") == 2  # the model, and the first --served-model-name


def test_the_openai_module_gets_model_as_a_flag_wherever_the_users_flags_are(tmp_path):
    b = VllmBackend(vllm_cmd="python -m vllm.entrypoints.openai.api_server --load-format dummy", log_dir=tmp_path)
    argv = b.argv(DEP, ServeConfig(), port=9, version="0.26.0")
    assert argv[argv.index("--model") + 1] == "qwen2.5-7b" and argv[:5][-1] == "dummy"


def test_startup_facts_are_read_from_the_log():
    log = ("INFO [gpu_model_runner.py:1] Model loading took 14.25 GiB memory and 5.1 seconds\n"
           "INFO [gpu_worker.py:2] Available KV cache memory: 52.1 GiB\n"
           "INFO [kv_cache_utils.py:3] GPU KV cache size: 975,616 tokens, Maximum concurrency for 32,768 "
           "tokens per request: 29.77x\n"
           "INFO [gpu_model_runner.py:4] Graph capturing finished in 12 secs, took 0.56 GiB\n")
    assert parse_startup(log) == {"kv_cache_tokens": 975616, "max_concurrency": 29.77, "model_load_gib": 14.25,
                                  "available_kv_gib": 52.1, "graph_capture_s": 12.0, "graph_capture_gib": 0.56}
    assert parse_startup("INFO # GPU blocks: 27000, # CPU blocks: 2048")["num_gpu_blocks"] == 27000


# -- end to end against tuner sim-serve ------------------------------------------------------

def test_start_replay_close_against_sim_serve(tmp_path):
    # through the CLI, as a user would write --vllm-cmd
    backend = VllmBackend(vllm_cmd=f"{sys.executable} -m tuner sim-serve --speed 20", log_dir=tmp_path,
                          startup_timeout_s=60, stop_grace_s=5)
    cfg = ServeConfig(max_model_len=8192, max_num_seqs=64)
    plan = plan_memory(DEP, cfg)
    with backend.start(DEP, cfg) as inst:
        info = inst.info
        assert info["kv_cache_tokens"] == plan.kv_cache_tokens
        assert info["num_gpu_blocks"] == plan.num_gpu_blocks  # from /metrics cache_config_info
        assert info["model_name"] == "qwen2.5-7b" and info["startup_s"] > 0
        assert "--max-num-seqs" in info["argv"][0] and os.path.exists(info["log_paths"][0])
        r = inst.run(_workload(), Concurrency(16))
        pgids = inst.pgids
    assert r.error == [None] * 40
    assert r.server["num_requests_running_max"] <= 16 and r.server["kv_cache_tokens"] == plan.kv_cache_tokens
    assert not any(group_alive(g) for g in pgids)


def test_two_replicas_get_their_own_gpus_ports_and_logs(backend):
    dep = Deployment(model="qwen2.5-7b", gpu="H100-SXM", gpu_count=2, gpu_ids=(4, 6))
    with backend.start(dep, ServeConfig(max_model_len=4096, replicas=2)) as inst:
        assert inst.info["cuda_visible_devices"] == ["4", "6"]
        assert len(set(inst.urls)) == 2 and len(set(inst.info["log_paths"])) == 2
        assert all("CUDA_VISIBLE_DEVICES=" in open(p).read() for p in inst.info["log_paths"])
        r = inst.run(_workload(20), Concurrency(4))
    assert r.error == [None] * 20


def test_refused_start_is_config_rejected_with_the_planners_message(backend):
    cfg = ServeConfig(max_model_len=32768, gpu_memory_utilization=0.3)
    dep = Deployment(model="qwen2.5-14b", gpu="V100-32GB-SXM2", vllm_version="0.6.3")
    with pytest.raises(ConfigRejected) as refused:  # the planner refuses this one
        plan_memory(dep, cfg)
    expected = refused.value
    with pytest.raises(ConfigRejected) as err:
        backend.start(dep, cfg)
    assert err.value.kind == expected.kind
    assert err.value.message == expected.message
    assert err.value.log_path and err.value.log_path.endswith("-r0.log")


def test_a_flag_the_server_rejects_is_an_environment_fault(tmp_path):
    b = VllmBackend(vllm_cmd=SIM, log_dir=tmp_path, extra_args=["--no-such-flag"], startup_timeout_s=30)
    with pytest.raises(EnvironmentFault) as err:
        b.start(DEP, ServeConfig(max_model_len=4096))
    assert err.value.kind == "bad_flag" and "--no-such-flag" in err.value.message
    assert "--vllm-version" in err.value.message  # what to check


def test_slow_start_times_out_and_is_killed(tmp_path):
    b = VllmBackend(vllm_cmd=SIM + " --startup-delay-s 60", log_dir=tmp_path, startup_timeout_s=1.5,
                    stop_grace_s=2)
    t = time.monotonic()
    with pytest.raises(ConfigRejected) as err:
        b.start(DEP, ServeConfig(max_model_len=4096))
    assert err.value.kind == "timeout" and time.monotonic() - t < 15


@pytest.mark.parametrize("sig, kind", [(signal.SIGKILL, "killed"), (signal.SIGABRT, "disrupted")],
                         ids=["killed_from_outside", "crashed"])
def test_a_server_dead_mid_run_is_the_machines_when_killed_from_outside_else_a_disrupted_measurement(backend, sig,
                                                                                                     kind):
    """A signal from outside is the machine's (``killed``); a death of its own mid-replay
    disrupted the measurement (the search decides whose it is by experiment)."""
    inst = backend.start(DEP, ServeConfig(max_model_len=8192))
    try:
        w = Workload(arrival_s=np.zeros(200), prompt_tokens=np.full(200, 500), output_tokens=np.full(200, 400))
        pid = inst.replicas[0].proc.pid
        threading.Timer(1.0, os.kill, (pid, sig)).start()
        with pytest.raises(EnvironmentFault) as err:
            inst.run(w, Concurrency(32))
        assert "during the run" in str(err.value) and err.value.kind == kind
        assert isinstance(err.value, Disrupted) is (kind == "disrupted")
    finally:
        inst.close()
    assert not group_alive(inst.pgids[0])


def test_close_is_sigterm_then_sigkill_on_our_group_only(backend):
    bystander = psutil.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        inst = backend.start(DEP, ServeConfig(max_model_len=4096))
        pgid = inst.pgids[0]
        assert pgid != os.getpgid(0)  # its own session: signals to it never reach us
        inst.close()
        inst.close()  # idempotent
        assert not group_alive(pgid)
        assert bystander.is_running()
    finally:
        bystander.kill()
        bystander.wait()


def test_get_backend_builds_each_backend(tmp_path):
    assert get_backend("vllm", vllm_cmd=SIM, log_dir=tmp_path).name == "vllm"
    assert get_backend("endpoint", urls=["http://127.0.0.1:1"]).name == "endpoint"
    assert get_backend("sim").name == "sim"


def test_a_vllm_api_key_in_the_environment_does_not_reach_the_servers_tuner_starts(backend, monkeypatch):
    # vLLM would demand it from every request; tuner starts the server and sends none
    monkeypatch.setenv("VLLM_API_KEY", "sk-not-for-the-server")
    with backend.start(DEP, ServeConfig(max_model_len=4096, max_num_seqs=16)) as inst:
        pid = inst.replicas[0].proc.pid
        environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        assert not any(v.startswith(b"VLLM_API_KEY=") for v in environ)
        assert inst.run(_workload(8), Concurrency(4)).error == [None] * 8

"""GPU memory other processes hold is found before a start (a stub ``nvidia-smi`` on PATH
answers as the real one does), named, and refused as the environment's fault."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tuner.backends import gpu_memory
from tuner.backends.vllm import VllmBackend
from tuner.core.errors import EnvironmentFault
from tuner.serving.config import Deployment, ServeConfig

UUID0, UUID1 = "GPU-1111aaaa-0000-0000-0000-000000000000", "GPU-2222bbbb-0000-0000-0000-000000000000"


def stub_nvidia_smi(folder, apps: list[tuple[str, int, str, int]]) -> None:
    """An ``nvidia-smi`` answering the two queries tuner makes, in its csv,noheader,nounits form."""
    gpus = f"0, {UUID0}\\n1, {UUID1}\\n"
    rows = "".join(f"{u}, {pid}, {name}, {mib}\\n" for u, pid, name, mib in apps)
    script = folder / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=*) printf '{gpus}' ;;
  --query-compute-apps=*) printf '{rows}' ;;
  *) exit 9 ;;
esac
""")
    script.chmod(stat.S_IRWXU)


@pytest.fixture
def path_with(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_holders_are_read_per_gpu_index(path_with):
    stub_nvidia_smi(path_with, [(UUID0, 4242, "python3", 30822), (UUID1, 4343, "/usr/bin/other", 1024)])
    assert gpu_memory.holders([1]) == [gpu_memory.Holder(gpu=1, pid=4343, name="/usr/bin/other", used_mib=1024.0)]
    assert [h.pid for h in gpu_memory.holders([0, 1])] == [4242, 4343]


def test_without_nvidia_smi_there_is_nothing_to_check(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    assert gpu_memory.holders([0]) == []


def test_our_own_servers_are_not_foreign(path_with):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        stub_nvidia_smi(path_with, [(UUID0, child.pid, "python3", 2048), (UUID0, 4242, "python3", 512)])
        assert [h.pid for h in gpu_memory.foreign_holders([0], {child.pid})] == [4242]
    finally:
        child.kill()
        child.wait()


def test_a_start_on_a_gpu_another_process_holds_is_refused_naming_it_and_nothing_is_launched(tmp_path, path_with):
    stub_nvidia_smi(path_with, [(UUID1, 4242, "python3", 30822)])
    ran = tmp_path / "vllm-ran"
    vllm = path_with / "vllm"
    vllm.write_text(f"#!/bin/sh\ntouch {ran}\nsleep 60\n")
    vllm.chmod(stat.S_IRWXU)
    b = VllmBackend(vllm_cmd="vllm serve", log_dir=tmp_path / "logs", platform="cuda", vllm_version="0.26.0")
    dep = Deployment(model="qwen2.5-7b", gpu="H100-SXM", gpu_count=1, gpu_ids=(1,))
    with pytest.raises(EnvironmentFault) as err:
        b.start(dep, ServeConfig())
    assert err.value.kind == "gpu_busy"
    assert "pid 4242 (python3) holds 30.1 GiB on GPU 1" in str(err.value) and "--gpus" in str(err.value)
    assert not ran.exists()
    # the same GPU free: the start goes ahead (the stub server then never answers; not waited for here)
    stub_nvidia_smi(path_with, [(UUID0, 4242, "python3", 30822)])
    b.check_gpus_free(["1"])

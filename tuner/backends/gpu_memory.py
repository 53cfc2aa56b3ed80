"""Who holds memory on the GPUs a server is about to get, from NVML through ``nvidia-smi``.

vLLM sizes its KV cache from the memory free when it starts (``--gpu-memory-utilization``
is a share of the whole GPU): memory another process holds makes every configuration fail
or shrink alike, and a study that learnt from that would blame the configurations. So
before a start :func:`foreign_holders` lists the compute processes on those GPUs that are
not servers of this run (found by tuner's marker, not by their process group), and the
backend refuses the start as an environment fault that names them. Without ``nvidia-smi`` (no GPU here, the CPU build) there is nothing to check.
"""  # noqa: E501
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import psutil

from tuner.runtime.processes import is_ours

#: How long ``nvidia-smi`` may take (a GPU in a bad state can hang it).
QUERY_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Holder:
    """A compute process holding memory on one GPU."""

    gpu: int
    pid: int
    name: str
    used_mib: float

    def describe(self) -> str:
        return f"pid {self.pid} ({self.name}) holds {self.used_mib / 1024:.1f} GiB on GPU {self.gpu}"


def _query(exe: str, what: str) -> list[list[str]]:
    try:
        out = subprocess.run([exe, f"--query-{what}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [[x.strip() for x in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def holders(gpus: Iterable[int]) -> list[Holder]:
    """Compute processes on ``gpus`` (NVML indices) as ``nvidia-smi`` lists them; ``[]``
    when there is no ``nvidia-smi`` or it cannot answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    wanted = set(gpus)
    index = {row[1]: int(row[0]) for row in _query(exe, "gpu=index,uuid") if len(row) >= 2 and row[0].isdigit()}
    out = []
    for row in _query(exe, "compute-apps=gpu_uuid,pid,process_name,used_memory"):
        if len(row) < 4 or not row[1].isdigit() or row[0] not in index or index[row[0]] not in wanted:
            continue
        try:
            used = float(row[3])
        except ValueError:
            used = 0.0
        out.append(Holder(gpu=index[row[0]], pid=int(row[1]), name=row[2], used_mib=used))
    return out


def _in_groups(pid: int, pgids: Collection[int]) -> bool:
    try:
        proc = psutil.Process(pid)
        return os.getpgid(pid) in pgids or any(p.pid in pgids for p in proc.parents())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError):
        return False


def foreign_holders(gpus: Iterable[int], ours: Collection[int] = ()) -> list[Holder]:
    """:func:`holders` that are not this run's: neither carrying this process's marker
    (:func:`tuner.runtime.processes.is_ours`: a server of this run, whatever launcher put it
    in another group or session) nor in the process groups ``ours``."""

    return [h for h in holders(gpus) if not is_ours(h.pid) and not _in_groups(h.pid, ours)]


__all__ = ["Holder", "foreign_holders", "holders"]

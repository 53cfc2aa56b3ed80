"""What a ``--vllm-cmd`` command line runs: its vLLM version (:func:`detect_version`) and
whether it is ``tuner sim-serve``, at what speed (:func:`sim_serve_speed`)."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path


def sim_serve_speed(argv: list[str]) -> float | None:
    """For a ``tuner sim-serve`` command line: its ``--speed`` (1 when not given); else None."""
    if not any("sim-serve" in a or a == "tuner.sim.server" for a in argv):
        return None
    for i, a in enumerate(argv):
        if a == "--speed" and i + 1 < len(argv):
            return float(argv[i + 1])
        if a.startswith("--speed="):
            return float(a.split("=", 1)[1])
    return 1.0


def detect_version(vllm_cmd: str, *, timeout_s: float = 120.0) -> str | None:
    """The vLLM version the command would run, or None when it cannot be told.

    For ``vllm ...`` the Python beside the ``vllm`` executable is asked
    (``python -c "import vllm; print(vllm.__version__)"``); for ``python -m vllm...``
    that Python is asked. Containers and wrappers cannot be asked: pass the version."""
    argv = shlex.split(vllm_cmd)
    if not argv:
        return None
    python: str | None = None
    if Path(argv[0]).name == "vllm":
        exe = shutil.which(argv[0])
        if exe:
            sibling = Path(exe).with_name("python")
            python = str(sibling) if sibling.exists() else sys.executable
    elif Path(argv[0]).name.startswith("python") and len(argv) > 2 and argv[1] == "-m" and argv[2].startswith("vllm"):
        python = argv[0]
    if python is None:
        return None
    try:
        out = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1].strip() if out.returncode == 0 and lines else None

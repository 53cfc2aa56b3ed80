"""README.md as a reader uses it: every file a command names is in the repository, and every
block marked ``<!-- runnable -->`` runs as pasted (on the simulator, in an empty folder with
the repository's search spaces beside it), in the order a reader meets them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
#: Paths into the repository as commands in README name them.
REPO_PATH = re.compile(r"(?<![\w/.~$-])((?:search_spaces|benchmarks|tests|notebooks|docs|\.ci)/[\w./-]+\.\w+)")


def blocks() -> list[tuple[int, str, str, bool]]:
    """(line, language, text, runnable) of each fenced block."""
    text = README.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip().splitlines()[-1:] or [""]
        out.append((line, m.group(1), m.group(2), before[0].strip() == "<!-- runnable -->"))
    return out


def test_every_file_a_readme_command_names_is_in_the_repository():
    missing = [f"README.md:{line}: {path}" for line, lang, text, _ in blocks() if lang in ("bash", "text", "python", "")
               for path in REPO_PATH.findall(text) if "NAME" not in path and not (REPO / path).exists()]
    assert not missing, missing


def test_some_blocks_are_marked_runnable():
    assert any(runnable for *_, runnable in blocks())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_runnable_blocks_run_as_pasted(tmp_path):
    (tmp_path / "search_spaces").symlink_to(REPO / "search_spaces")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg", "COLUMNS": "120"}
    for line, lang, text, runnable in blocks():
        if not runnable:
            continue
        if lang == "python":
            argv = [sys.executable, "-c", text]
        elif lang == "bash":
            argv = ["bash", "-euo", "pipefail", "-c", text]
        else:
            pytest.fail(f"README.md:{line}: a runnable block must be bash or python, not {lang!r}")
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=800)
        assert done.returncode == 0, f"README.md:{line}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, f"README.md:{line}: {done.stderr[-2000:]}"

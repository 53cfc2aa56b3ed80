"""docs/fleet.md as a reader uses it: every block marked ``<!-- runnable -->`` runs as pasted (on the
simulator, in an empty folder with the repository's search spaces beside it), in order, and prints
what the page shows after it (the plans are seeded: only the lines of time spent and files written
may differ)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "fleet.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


def blocks() -> list[tuple[int, str, str, bool]]:
    text = DOC.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip().splitlines()[-1:] or [""]
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2), before[0].strip() == "<!-- runnable -->"))
    return out


def _shown(text: str) -> list[str]:
    """The lines a run prints that do not depend on the clock or the folder."""
    lines = text.rstrip("\n").splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith("took ")), len(lines))
    return [line.rstrip() for line in lines[:cut]]


def test_the_page_has_runnable_blocks_each_with_its_output():
    found = blocks()
    runnable = [i for i, b in enumerate(found) if b[3]]
    assert len(runnable) >= 3
    for i in runnable:
        assert found[i + 1][1] == "text", f"docs/fleet.md:{found[i][0]}: a runnable block is followed by its output"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_runnable_blocks_run_as_pasted_and_print_what_the_page_shows(tmp_path):
    (tmp_path / "search_spaces").symlink_to(REPO / "search_spaces")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg", "COLUMNS": "100"}
    env.pop("TUNER_CALIBRATION_DIR", None)
    found = blocks()
    for i, (line, lang, text, runnable) in enumerate(found):
        if not runnable:
            continue
        argv = [sys.executable, "-c", text] if lang == "python" else ["bash", "-euo", "pipefail", "-c", text]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=800)
        assert done.returncode == 0, f"docs/fleet.md:{line}: exit {done.returncode}\n{done.stderr[-2000:]}"
        shown = found[i + 1][2]
        if lang == "bash":
            assert shown.startswith(f"$ {text.strip()}\n"), f"docs/fleet.md:{line}: the output shows another command"
            shown = shown.split("\n", 1)[1]
        assert _shown(done.stdout) == _shown(shown), f"docs/fleet.md:{line}: the page shows other output"

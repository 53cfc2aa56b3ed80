"""ruff, with the rules pyproject.toml configures (pyflakes' unused imports and undefined names, pycodestyle's
line length, bugbear), passes over everything the project ships and runs: tuner/, tests/, benchmarks/, .ci/."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_passes_with_the_configured_rules():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "tuner", "tests", "benchmarks", ".ci"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_the_rules_catch_an_unused_import_and_a_long_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = '" + "y" * 130 + "'\n")
    config = str(ROOT / "pyproject.toml")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", config, str(bad)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "F401" in done.stdout and "E501" in done.stdout, done.stdout

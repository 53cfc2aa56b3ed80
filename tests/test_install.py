"""Installs are reproducible: README's commands and CI install the versions pinned in
constraints.txt (written by .ci/lock.sh), and .ci/run runs README's test command as written."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _quick_start_commands() -> list[str]:
    quick = REPO.joinpath("README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", quick)


def test_readme_installs_pinned_versions_and_ci_runs_its_test_command():
    commands = _quick_start_commands()
    assert len(commands) == 2 and all(" -c constraints.txt " in c for c in commands), commands
    test_command = next(c for c in commands if c.endswith("&& pytest -q"))
    assert test_command in REPO.joinpath(".ci/run").read_text().splitlines()


def test_constraints_pin_every_dependency_exactly_and_not_tuner():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads(REPO.joinpath("pyproject.toml").read_text())["project"]
    lines = [x for x in REPO.joinpath("constraints.txt").read_text().splitlines() if x and not x.startswith("#")]
    pins = {_name(x): x for x in lines}
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[^=\s]+", x) for x in lines), [x for x in lines if "==" not in x]
    wanted = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    assert wanted <= set(pins), sorted(wanted - set(pins))
    assert "tuner" not in pins

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


def test_readme_installs_pinned_versions_and_ci_runs_its_two_commands():
    """CI runs README's commands as README shows them: .ci/run calls the newcomer job, which reads the two
    commands out of README's quick start (the same two this test finds) and types them into a terminal."""
    commands = _quick_start_commands()
    assert len(commands) == 2 and all(" -c constraints.txt " in c for c in commands), commands
    assert commands[1].endswith("&& pytest -q") and commands[0].endswith("&& tuner search --budget 40")
    run = [line.strip() for line in REPO.joinpath(".ci/run").read_text().splitlines()]
    assert any(line.startswith("python3 .ci/newcomer.py") for line in run), "the newcomer job is not run by CI"
    newcomer = _load_newcomer()
    assert list(newcomer.readme_commands()) == commands


def _load_newcomer():
    import importlib.util

    spec = importlib.util.spec_from_file_location("newcomer", REPO / ".ci" / "newcomer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_constraints_pin_every_dependency_exactly_and_not_tuner():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads(REPO.joinpath("pyproject.toml").read_text())["project"]
    lines = [x for x in REPO.joinpath("constraints.txt").read_text().splitlines() if x and not x.startswith("#")]
    pins = {_name(x): x for x in lines}
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[^=\s]+", x) for x in lines), [x for x in lines if "==" not in x]
    wanted = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    assert wanted <= set(pins), sorted(wanted - set(pins))
    assert "tuner" not in pins


#: Imported only where a user asked for what needs them, each behind a message that says
#: what to install: GP sampling (torch), tokenizing text prompts of a trace (tokenizers or
#: transformers).
OPTIONAL_IMPORTS = {"torch", "tokenizers", "transformers"}
#: The backend contract (``tuner.testing``) is a pytest class that only tests import
#: (tests/test_architecture.py holds that): pytest is its test extra's, not tuner's.
TEST_ONLY_IMPORTS = {"pytest"}
TEST_ONLY_PART = "tuner/testing/"


def test_every_package_tuner_imports_is_a_declared_dependency():
    """`pip install -e .` (README's main command) must bring every package tuner imports:
    psutil was imported by the search and installed only by the test extra's ipykernel, so
    `tuner search` failed on a fresh install with ModuleNotFoundError."""
    import ast
    import sys
    from importlib.metadata import packages_distributions

    tomllib = pytest.importorskip("tomllib")
    declared = {_name(r) for r in tomllib.loads(REPO.joinpath("pyproject.toml").read_text())["project"]["dependencies"]}
    imported: dict[str, str] = {}
    for path in sorted(REPO.joinpath("tuner").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                top = name.split(".")[0]
                if top != "tuner" and top not in sys.stdlib_module_names:
                    imported.setdefault(top, str(path.relative_to(REPO)))
    dists = packages_distributions()
    missing = {mod: where for mod, where in imported.items() if mod not in OPTIONAL_IMPORTS
               and not {_name(d) for d in dists.get(mod, [mod])} & declared
               and not (mod in TEST_ONLY_IMPORTS and where.startswith(TEST_ONLY_PART))}
    assert not missing, f"imported but not in [project].dependencies: {missing}"

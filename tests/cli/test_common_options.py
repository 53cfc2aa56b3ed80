"""The options several commands take are declared once (tuner.cli.options), so they cannot
drift apart: one ``typer.Option`` per flag in tuner/cli/, however many commands take it."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import typer.main

from tuner.cli import _register, app

CLI = Path(__file__).parents[2] / "tuner" / "cli"
SHARED = ("--storage", "--backend", "--vllm-cmd", "--trace")


def declarations() -> Counter[str]:
    found: Counter[str] = Counter()
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "typer.Option":
                found.update(a.value for a in node.args if isinstance(a, ast.Constant) and a.value in SHARED)
    return found


def test_each_shared_option_is_declared_once_and_taken_by_several_commands():
    assert declarations() == Counter({flag: 1 for flag in SHARED})
    _register()
    taken: Counter[str] = Counter()

    def walk(command: object) -> None:
        for param in getattr(command, "params", []):
            taken.update(o for o in getattr(param, "opts", []) if o in SHARED)
        for sub in (getattr(command, "commands", None) or {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    assert taken["--storage"] >= 7 and taken["--backend"] >= 4 and taken["--vllm-cmd"] >= 4 and taken["--trace"] >= 4

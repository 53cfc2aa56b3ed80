"""Every command's --help at 80 columns: readable (no line wider, no option name cut, no
type shown on a plain flag, the choices of an option listed), and teaching (what the
command does, with an example line)."""
from __future__ import annotations

import re
from enum import Enum

import pytest
import typer.main
from cli_runner import run_cli

from tuner.cli import _register, app


def _commands() -> list[tuple[list[str], object]]:
    _register()
    found: list[tuple[list[str], object]] = []

    def walk(path: list[str], command: object) -> None:
        found.append((path, command))
        for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
            walk([*path, name], sub)

    walk([], typer.main.get_command(app))
    return found


COMMANDS = _commands()


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "tuner" for p, _ in COMMANDS])
def test_help_fits_80_columns_and_names_every_option_whole(path, command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli([*path, "--help"], capsys)
    assert code == 0 and out.strip()
    own_help = bool(getattr(command, "add_help_option", True))
    if not own_help:  # sim-serve passes --help to its own (argparse) parser
        assert "--max-num-seqs" in out and "…" not in out
        return
    assert "…" not in out and "<bool>" not in out
    for line in out.splitlines():
        assert len(line) <= 80, f"{' '.join(path)} --help: {line!r} is {len(line)} wide"
    for param in getattr(command, "params", []):
        if getattr(param, "hidden", False):  # an old spelling kept for scripts (tuner.cli.options.RENAMED)
            assert not re.search(rf"(?<![\w-]){re.escape(param.opts[0])}(?![\w-])", out), f"{param.opts[0]} shown"
            continue
        for name in [*param.opts, *getattr(param, "secondary_opts", [])]:
            if name.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", out), f"{name} is cut or missing"
        if getattr(param, "is_flag", False):  # a plain flag shows no value type
            line = next(x for x in out.splitlines() if param.opts[0] in x)
            assert "<" not in line.split(param.opts[0], 1)[1].split("  ")[0], line
        choices = getattr(getattr(param, "type", None), "choices", None)
        if choices:
            shown = [c.value if isinstance(c, Enum) else str(c) for c in choices]
            assert all(c in out for c in shown), f"{param.name}: choices {shown} not listed"


@pytest.mark.parametrize(("path", "command"), [c for c in COMMANDS if c[0]], ids=[" ".join(p) for p, _ in COMMANDS if p])  # noqa: E501
def test_every_command_says_what_it_does_with_an_example(path, command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    text = command.help or ""
    assert re.search(r"Examples?:\s*\n\s+tuner ", text), f"tuner {' '.join(path)} has no example line"
    short = command.get_short_help_str(limit=63)
    assert short and not short.endswith("..."), f"tuner {' '.join(path)}: short help {short!r} is cut"
    for param in getattr(command, "params", []):
        assert getattr(param, "help", None) or param.name == "ctx", f"{' '.join(path)} {param.name} has no help"


def test_the_top_level_list_shows_each_command_whole(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    _, out, _ = run_cli(["--help"], capsys)
    listing = out[out.index("Commands:"):]
    assert "..." not in listing
    for name in ("search", "plan", "report", "export", "studies", "trace", "estimate"):
        assert re.search(rf"^  {name} ", listing, re.M), name


@pytest.mark.parametrize(("argv", "words"), [
    (["search", "--backend", "cloud"], "'cloud' is not one of 'sim', 'vllm', 'endpoint'"),
    (["search", "--sampler", "annealing"], "'annealing' is not one of"),
    (["plan", "--output", "yaml"], "'yaml' is not one of 'text', 'json'"),
    (["studies", "show"], "missing argument"),
    (["nosuch"], "no such command 'nosuch'"),
])
def test_a_usage_error_is_one_line_naming_the_help_to_read(argv, words, capsys):
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == ""
    assert err.startswith("tuner: ") and err.count("\n") == 1 and words in err
    assert "--help)" in err


def test_the_sampler_choices_are_the_samplers_search_knows():
    from tuner.cli.options import Sampler
    from tuner.search import SAMPLERS

    assert [s.value for s in Sampler] == list(SAMPLERS)


def test_version_is_one_line_and_the_version_of_the_package(capsys):
    import tomllib
    from pathlib import Path

    import tuner

    code, out, err = run_cli(["--version"], capsys)
    project = tomllib.loads((Path(tuner.__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert code == 0 and err == "" and out.count("\n") == 1
    assert out.startswith(f"tuner {project['version']} (") and tuner.__version__ == project["version"]

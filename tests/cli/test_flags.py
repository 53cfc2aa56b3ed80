"""One spelling per concept: a flag that several commands share takes the same spellings
and the same kind of value in each, no command shows a spelling that was replaced
(tuner.cli.options.RENAMED), and the old spellings still work for scripts, with a note."""
from __future__ import annotations

from collections import defaultdict
from enum import Enum
from pathlib import Path

import pytest
import typer.main
from cli_runner import run_cli

from tuner.cli import _register, app
from tuner.cli.options import RENAMED

#: Flags that mean one thing per command on purpose, and why.
SAME_NAME_OTHER_VALUE = {
    "--out": "a folder where a command writes several files, export's one FILE (or - for stdout)",
    "--format": "the format of the file a command reads (trace) or writes (export): each lists its own",
    "--trials": "nightly: how many new trials; calibrate: which of its designed trials",
}


def _options() -> dict[str, list[tuple[str, object]]]:
    """Every visible option, by its first long spelling: [(command, click parameter)]."""
    _register()
    found: dict[str, list[tuple[str, object]]] = defaultdict(list)

    def walk(path: list[str], command: object) -> None:
        for param in getattr(command, "params", []):
            if param.param_type_name == "option" and not getattr(param, "hidden", False):
                found[param.opts[0]].append((" ".join(path), param))
        for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
            walk([*path, name], sub)

    walk([], typer.main.get_command(app))
    return found


OPTIONS = _options()


def _kind(param) -> str:
    """What the option takes: a flag, text (a path is text), a number, or a choice."""
    if getattr(param, "is_flag", False):
        return "flag"
    kind = param.type_descriptor.annotation
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "a choice"  # the choices may differ (calibrate has no endpoint); --help lists them
    return "text" if kind is Path else getattr(kind, "__name__", str(kind))


def test_no_command_shows_a_replaced_spelling():
    shown = {name: [c for c, _ in OPTIONS[name]] for name in RENAMED if name in OPTIONS}
    assert not shown, f"replaced spellings still shown: {shown}"
    every = {n for uses in OPTIONS.values() for _, p in uses for n in (*p.opts, *p.secondary_opts)}
    assert set(RENAMED.values()) <= every  # each replacement is a flag some command has


@pytest.mark.parametrize("flag", sorted(n for n, uses in OPTIONS.items() if len(uses) > 1))
def test_a_shared_flag_is_spelled_and_valued_alike_in_every_command(flag):
    uses = OPTIONS[flag]
    spellings = {c: sorted((*p.opts, *p.secondary_opts)) for c, p in uses}
    assert len({tuple(s) for s in spellings.values()}) == 1, f"{flag} is spelled differently: {spellings}"
    if flag in SAME_NAME_OTHER_VALUE:
        return
    kinds = {c: _kind(p) for c, p in uses}
    assert len(set(kinds.values())) == 1, f"{flag} takes different values: {kinds}"


@pytest.mark.parametrize(("old", "argv"), [
    ("--rates", ["plan", "--gpu", "H100-SXM", "--rates", "0", "--no-files", "--no-store"]),
    ("--wall-clock", ["nightly", "--wall-clock", "never"]),
    ("--tp", ["plan", "--study", "x", "--tp", "2"]),
    ("--budget-s", ["calibrate", "--model", "nowhere", "--gpu", "H100-SXM", "--backend", "sim",
                    "--budget-s", "never"]),
])
def test_an_old_spelling_still_reaches_the_option_with_a_one_line_note(old, argv, capsys):
    code, out, err = run_cli(argv, capsys)
    new = RENAMED[old]
    assert f"tuner: note: {old} is now spelled {new}" in err
    # the value went where the new spelling sends it: its own check refuses it, by the new name
    assert code == 2 and out == "" and (new in err.splitlines()[-1] or "must be > 0" in err), err


def test_old_and_new_spelling_with_two_values_is_refused(capsys):
    code, _, err = run_cli(["plan", "--gpu", "H100-SXM", "--rate", "2", "--rates", "4", "--no-files"], capsys)
    assert code == 2 and "same option, given two values" in err and "--rate" in err


def test_the_machine_flags_read_alike_in_estimate_and_plan(capsys):
    """--gpus not given is what the layout needs (tp x replicas), given it is read as search
    reads it; --quantization none is no quantization, in estimate as in plan and search."""
    from tuner.cli._knobs import build_deployment_config

    common = dict(model="qwen2.5-7b", gpu="H100-SXM", vllm_version="0.26.0", dtype="auto", knobs={})
    deployment, config = build_deployment_config(gpus=None, quantization="None", tp=2, replicas=3, **common)
    assert (deployment.gpu_count, deployment.gpu_ids, deployment.quantization) == (6, (), None)
    assert (config.tensor_parallel_size, config.replicas) == (2, 3)
    deployment, _ = build_deployment_config(gpus="0-1,4", quantization="awq", tp=1, replicas=1, **common)
    assert (deployment.gpu_count, deployment.gpu_ids, deployment.quantization) == (3, (0, 1, 4), "awq")
    plain = run_cli(["estimate", "--output", "json"], capsys)
    assert plain[0] == 0
    assert run_cli(["estimate", "--quantization", "none", "--output", "json"], capsys) == plain

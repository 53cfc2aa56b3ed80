"""Progress goes to stderr, with steps done and time left: stdout stays one JSON object with
--output json while the bar is drawn, and nothing is drawn when stderr is no terminal."""
from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

import tuner.cli.progress as progress
from tuner.cli.progress import Bar, Runs

CONFIG = ["--gpu", "H100-SXM", "--model", "qwen2.5-7b", "--max-num-seqs", "64", "--max-model-len", "4096"]


@pytest.mark.parametrize(("argv", "unit"), [
    (["plan", *CONFIG, "--target-ttft", "1s", "-c", "4,16", "-n", "120", "--no-files", "--no-store"], "runs"),
    (["estimate", "-c", "1,4", "-n", "60"], "runs"),
])
def test_json_on_stdout_stays_clean_while_the_bar_is_drawn_on_stderr(argv, unit, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(progress, "shown", lambda: True)
    code, out, err = run_cli([*argv, "--output", "json"], capsys)
    assert code == 0, err
    json.loads(out)  # the whole of stdout is the JSON object
    assert unit in err and "left" in err  # the bar, with its ETA column, went to stderr


def test_without_a_terminal_no_bar_is_drawn(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(progress, "shown", lambda: False)
    code, out, err = run_cli(["estimate", "-c", "1,4", "-n", "60", "--output", "json"], capsys)
    assert code == 0 and json.loads(out) and "runs" not in err


def test_plan_counts_a_run_a_phase_and_grows_its_total_with_extensions():
    bar = Runs(2, enabled=False)
    with bar:
        bar.on_phase("pre-check")
        for level in (4, 16, 24, 36):  # two levels, two extensions
            bar.on_phase(f"repeat 1: sweep run at {level} users")
        assert bar.progress.tasks[0].completed == 3 and bar.progress.tasks[0].total == 3
    task = bar.progress.tasks[0]
    assert task.completed == task.total == 4  # the last run ends with the call


def test_a_resumed_study_starts_the_bar_part_way():
    bar = Bar("trials", 40, enabled=False, best=True)
    with bar:
        bar.on_start("s", finished=30, budget=60)
        task = bar.progress.tasks[0]
        assert (task.completed, task.total) == (30, 60)


@pytest.mark.parametrize("make", [lambda: Bar("trials", 4, enabled=False, best=True),
                                  lambda: Bar("report", None, enabled=False), lambda: Runs(2, enabled=False)],
                         ids=["search", "spinner", "plan"])
def test_every_hook_leaves_every_column_its_field(make):
    """Each hook, in any order, leaves the bar drawable: rich's reset replaces a task's fields
    with those it is given, and a column whose field is gone raises KeyError on the next redraw."""
    import io

    from rich.console import Console

    bar = make()
    hooks = [lambda: bar.on_start("s", 1, 4), lambda: bar.on_phase("repeat 1: sweep run at 8 users"),
             lambda: bar.on_trial(None, None, 2), lambda: bar.on_warning("w"), lambda: bar.step("x")]
    with bar:
        for order in (hooks, hooks[::-1]):
            for hook in order:
                hook()
                Console(file=io.StringIO(), width=80).print(bar.progress.get_renderable())
    with pytest.raises(TypeError, match="no column shows"):
        bar._set(bets="typo")  # a field no column shows is a typo, said at once

"""Every command with a progress display, run as a user runs it: a real ``tuner`` process in a
real pseudo-terminal (stdin, stdout and stderr a TTY, ``TERM`` set), at 80 and at 200 columns.

Each run must exit with its documented status, print no traceback, draw its live display (the
cursor hidden while rich redraws, shown again after: only the live display does that) and leave
its final output on the screen. Runs are small (a 40-request trace, a few trials) and nothing
here is timed: the hang guard is ``in_terminal``'s timeout."""
from __future__ import annotations

import json

import pytest
from terminal import BAR, Screen, in_terminal, tiny_trace

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_processes")]

WIDTHS = [80, 200]
SIM = ["--confirm", "1", "--confirm-max", "1"]  # one repeat of the winner: the race is shown, briefly


def _ok(screen: Screen, code: int = 0) -> Screen:
    assert screen.code == code, screen
    assert "Traceback" not in screen.flat, screen
    assert screen.drawn, f"no live display was drawn\n{screen}"
    return screen


@pytest.fixture
def trace(tmp_path):
    return tiny_trace(tmp_path / "tiny.jsonl")


@pytest.mark.parametrize("columns", WIDTHS)
def test_search_draws_its_bar_and_a_resumed_study_starts_it_part_way(tmp_path, trace, columns):
    first = _ok(in_terminal(["search", "--budget", "3", "--trace", trace.name, *SIM], tmp_path, columns))
    assert BAR in first.raw and "trials" in first.flat and "left" in first.flat  # the bar, its ETA column
    # the narrow terminal cuts the bar and the phase, never the count (rich cut "40/40" to "40/…" at 80 columns)
    assert "3/3" in first.flat and "/…" not in first.text, first
    assert "3 finished trials, 3 new" in first.flat and "best feasible trial" in first.flat
    assert "vllm serve Qwen/Qwen2.5-7B-Instruct" in first.flat
    again = _ok(in_terminal(["search", "--budget", "4", "--trace", trace.name, *SIM], tmp_path, columns))
    assert "3/4" in again.flat  # the resumed study's bar starts at the trials it holds
    assert "4 finished trials" in again.flat and "best feasible trial" in again.flat


@pytest.mark.parametrize("columns", WIDTHS)
def test_a_study_with_no_feasible_trial_exits_3_on_the_terminal_and_plan_says_why(tmp_path, trace, columns):
    search = _ok(in_terminal(["search", "--budget", "2", "--trace", trace.name, "--target-ttft", "1ms"],
                             tmp_path, columns), code=3)
    assert "no configuration met P95 TTFT <= 0.001 s" in search.flat and "trials" in search.flat
    plan = in_terminal(["plan", "--no-files"], tmp_path, columns)
    assert plan.code == 3 and "Traceback" not in plan.flat, plan
    assert "no feasible trial" in plan.flat


@pytest.mark.parametrize("columns", WIDTHS)
def test_plan_and_report_draw_their_display_on_a_study(tmp_path, trace, columns):
    made = in_terminal(["search", "--budget", "2", "--trace", trace.name, "--confirm", "0"], tmp_path, columns)
    assert made.code == 0, made
    plan = _ok(in_terminal(["plan", "-c", "2,8", "-n", "40", "--no-files"], tmp_path, columns))
    assert "runs" in plan.flat and BAR in plan.raw
    assert "max concurrency" in plan.flat and "tokens/s (in+out)" in plan.flat
    report = _ok(in_terminal(["report"], tmp_path, columns))
    assert "report" in report.flat and "report.html" in report.flat
    assert next(tmp_path.glob("studies/*/report.html")).stat().st_size > 0


@pytest.mark.parametrize("columns", WIDTHS)
def test_estimate_draws_a_bar_of_its_load_runs(tmp_path, columns):
    screen = _ok(in_terminal(["estimate", "-c", "1,4", "-n", "40"], tmp_path, columns))
    assert "runs" in screen.flat and BAR in screen.raw
    assert "concurrency" in screen.flat and "out tok/s" in screen.flat
    as_json = _ok(in_terminal(["estimate", "-c", "1,4", "-n", "40", "-o", "json"], tmp_path, columns))
    start = as_json.text.index("{")  # the bar went to the same terminal; the JSON is still whole
    json.JSONDecoder().raw_decode(as_json.text[start:])


@pytest.mark.parametrize("columns", WIDTHS)
def test_nightly_draws_its_bar_and_a_second_night_resumes(tmp_path, trace, columns):
    args = ["nightly", "--trials", "2", "--trace", trace.name]
    first = _ok(in_terminal(args, tmp_path, columns))
    assert "trials" in first.flat and BAR in first.raw and "first night" in first.flat
    second = _ok(in_terminal(args, tmp_path, columns))
    assert "trials" in second.flat and "report:" in second.flat


@pytest.mark.parametrize("columns", WIDTHS)
def test_calibrate_shows_its_steps_and_the_time_spent_while_it_runs(tmp_path, columns):
    screen = _ok(in_terminal(["calibrate", "--model", "qwen2.5-7b", "--gpu", "L4", "--backend", "sim",
                              "--trials", "base", "--starts", "1", "--max-evals", "5", "--out", "profile"],
                             tmp_path, columns))
    assert "calibrate: base c=1" in screen.flat and "fit error" in screen.flat
    assert "profile: " in screen.flat and (tmp_path / "profile" / "profile.yaml").is_file()

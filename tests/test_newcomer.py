"""The newcomer job (.ci/newcomer.py) judges README's transcript strictly: a changed figure fails it, the run
time alone does not; a terminal's carriage-return redraws and colours are read as the screen shows them;
it types into a real pseudo-terminal."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def newcomer():
    spec = importlib.util.spec_from_file_location("newcomer", REPO / ".ci" / "newcomer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_output(newcomer) -> str:
    return "\n".join(newcomer.readme_transcript("tuner search --budget 40"))


def test_readme_transcript_is_found_and_starts_with_the_study_line(newcomer):
    lines = newcomer.readme_transcript("tuner search --budget 40")
    assert lines[0].startswith("study ") and any(line.startswith("vllm serve ") for line in lines)


def test_the_same_output_passes_with_another_run_time_and_a_progress_bar_before_it(newcomer):
    out = readme_output(newcomer)
    slower = out.replace(" s (2 of them", " s (2 of them").replace("new in ", "new in 1").replace("\n", "\r\n")
    bar = "\x1b[?25ltrials \x1b[32m━━━━\x1b[0m 39/40\rtrials ━━━━━ 40/40 best 27,655 tok/s\r\n"
    newcomer.check_transcript(bar + "\x1b[1m" + slower + "\x1b[0m   \r\n", "tuner search --budget 40")


@pytest.mark.parametrize("change", [("#15", "#16"), ("27,655 tok/s", "27,656 tok/s"), ("fp8", "auto")])
def test_a_changed_figure_fails_and_names_the_line(newcomer, change):
    out = readme_output(newcomer)
    assert change[0] in out
    with pytest.raises(newcomer.Failed, match="differs from README's transcript"):
        newcomer.check_transcript(out.replace(change[0], change[1], 1), "tuner search --budget 40")


def test_a_traceback_or_a_wrong_exit_code_fails(newcomer):
    with pytest.raises(newcomer.Failed, match="traceback"):
        newcomer.check_clean(0, "Traceback (most recent call last):\nKeyError: 'best'", "x")
    with pytest.raises(newcomer.Failed, match="exit 1, README promises 0"):
        newcomer.check_clean(1, "no", "x")
    newcomer.check_clean(130, "Interrupted", "x", want=130)


def test_commands_run_in_a_real_terminal_of_the_width_asked(newcomer, tmp_path):
    code, out = newcomer.run_in_pty("test -t 0 && test -t 1 && test -t 2 && stty size && echo TERM=$TERM",
                                    tmp_path, cols=123, timeout_s=60, log=tmp_path / "log")
    assert code == 0, out
    assert "50 123" in out and "TERM=xterm-256color" in out


@pytest.mark.parametrize("parent", ["default", "ignores SIGINT"])
def test_ctrl_c_typed_into_the_terminal_interrupts_the_foreground_command(newcomer, tmp_path, parent):
    """Also when the process that runs the job ignores SIGINT (an ignored signal stays ignored across exec:
    in CI's suite, run inside the newcomer's own terminal, Ctrl-C once did nothing and sleep ran to the end)."""
    import signal

    before = signal.signal(signal.SIGINT, signal.SIG_IGN if parent != "default" else signal.default_int_handler)
    try:
        code, out = newcomer.run_in_pty("echo ready; sleep 60", tmp_path, cols=80, timeout_s=90,
                                        log=tmp_path / "log", react=lambda text: b"\x03" if "ready" in text else None)
    finally:
        signal.signal(signal.SIGINT, before)
    assert code == 130, (code, out)


def test_the_newcomer_environment_has_no_virtual_environment_active(newcomer, monkeypatch):
    monkeypatch.setenv("VIRTUAL_ENV", "/x/.venv")
    monkeypatch.setenv("PATH", os.pathsep.join(["/x/.venv/bin", "/usr/bin", "/bin"]))
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = newcomer.newcomer_env()
    assert env["PATH"].split(os.pathsep) == ["/usr/bin", "/bin"] and "PYTHONPATH" not in env
    assert "VIRTUAL_ENV" not in env

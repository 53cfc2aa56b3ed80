"""``tuner ... | head`` : when the reader of stdout goes away, tuner ends as ``cat`` does, quietly
(nothing on stderr) and killed by SIGPIPE (status 141 in the shell), after its cleanup: what
it finished (a study's trials) is kept, and no server of its own is left running."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _into_closed_pipe(argv: list[str], cwd) -> tuple[int, str]:
    """``tuner ARGV`` with its stdout a pipe whose reader closed before anything was written."""
    proc = subprocess.Popen([sys.executable, "-m", "tuner", *argv], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    proc.stdout.close()  # the reader is gone: every write to stdout meets EPIPE
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err.decode()


@pytest.mark.parametrize("argv", [["--help"], ["search", "--help"], ["estimate", "-o", "json"], ["estimate"],
                                  ["studies"], ["trace", "stats", "--help"]], ids=" ".join)
def test_a_closed_pipe_ends_the_command_as_cat_does(argv, tmp_path):
    code, err = _into_closed_pipe(argv, tmp_path)
    assert code == -signal.SIGPIPE and err == "", (code, err)


def test_a_search_whose_reader_went_away_keeps_its_study(tmp_path):
    code, err = _into_closed_pipe(["search", "--budget", "1", "--confirm", "0", "--study", "s", "-o", "json"],
                                  tmp_path)
    assert code == -signal.SIGPIPE and "Traceback" not in err and "Exception ignored" not in err, err
    shown = subprocess.run([sys.executable, "-m", "tuner", "studies", "show", "s", "-o", "json"], cwd=tmp_path,
                           capture_output=True, text=True, check=True)
    assert json.loads(shown.stdout)["budget_trials"] == 1

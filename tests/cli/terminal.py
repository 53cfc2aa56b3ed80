"""``in_terminal``: run ``tuner`` as a real process in a real pseudo-terminal, as a user types it
(stdin, stdout and stderr a TTY, ``TERM`` set, a given width), and return its exit status and
everything the terminal received; ``tiny_trace`` writes a small request log to replay.

pytest puts this folder on sys.path (there is no __init__.py), as for ``cli_runner``."""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

#: What rich's live display writes to a terminal and nothing else does: it hides the cursor
#: while it redraws, and shows it again when it stops.
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
#: A finished bar column (rich's BarColumn draws ━ when stdout is a terminal).
BAR = "━"
_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[=>()][0-9A-Za-z]?)")
#: Environment that would make rich draw (or not draw) whatever the terminal is.
_RICH_ENV = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES", "TUNER_DEBUG",
             "JUPYTER_COLUMNS", "JUPYTER_LINES")


@dataclass(frozen=True)
class Screen:
    """What a command left on the terminal: ``raw`` as received, ``text`` without escapes."""

    code: int
    raw: str

    @property
    def text(self) -> str:
        return _ANSI.sub("", self.raw).replace("\r", "")

    @property
    def flat(self) -> str:
        """``text`` with every run of whitespace one space: a sentence rich wrapped at 80
        columns reads as at 200."""
        return " ".join(self.text.split())

    @property
    def drawn(self) -> bool:
        """The live display ran: the cursor was hidden while it drew, shown again after."""
        return HIDE_CURSOR in self.raw and SHOW_CURSOR in self.raw.split(HIDE_CURSOR, 1)[1]

    def __str__(self) -> str:  # what an assertion shows
        return f"exit {self.code}:\n{self.text[-4000:]}"


def in_terminal(argv: list[str], cwd: Path, columns: int, *, rows: int = 40, timeout_s: float = 600) -> Screen:
    """``tuner ARGV`` in ``cwd`` on a ``columns``-wide pseudo-terminal, until it exits."""
    import pexpect

    env = {k: v for k, v in os.environ.items() if k not in _RICH_ENV}
    env["TERM"] = "xterm-256color"
    child = pexpect.spawn(sys.executable, ["-m", "tuner", *argv], cwd=str(cwd), env=env, encoding="utf-8",
                          codec_errors="replace", dimensions=(rows, columns), timeout=timeout_s)
    try:
        raw = child.read()  # everything, until the terminal closes (the hang guard is timeout_s)
        child.wait()
    finally:
        child.close(force=True)  # nothing left running, whatever happened
    code = child.exitstatus if child.exitstatus is not None else 128 + (child.signalstatus or 0)
    return Screen(code, raw)


def tiny_trace(path: Path, requests: int = 40, *, prompt: int = 400, output: int = 80) -> Path:
    """A request log of ``requests`` rows in tuner's own JSONL (a header line, then
    ``{"t", "in", "out"}``), one every 0.25 s, lengths varying around ``prompt``/``output``."""
    rows = [{"tuner_workload": 1, "origin": "tests", "block_tokens": 16, "estimated_tokens": False,
             "columns": [], "notes": [], "count": requests}]
    rows += [{"t": i * 0.25, "in": prompt // 2 + (i * 37) % prompt, "out": output // 2 + (i * 13) % output}
             for i in range(requests)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path

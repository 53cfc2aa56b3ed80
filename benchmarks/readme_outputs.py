"""Regenerate, or check, the command outputs pasted in README.md and the docs/ pages from the current code.

Every ``text`` block of a page whose lines start with ``$ `` is a transcript: each
``$`` line is a command (continued by a trailing backslash, or by a heredoc up to its
``EOF``), the lines up to the next ``$`` line its output. This script runs the commands
of all transcripts in reading order (README.md, then the pages of :data:`PAGES`, then any other
page), in one fresh temporary folder (so that ``tuner plan`` finds the study the ``tuner search``
before it made), on the simulator, with ``COLUMNS=80``, stdout and stderr together as a terminal
shows them, and puts what each printed in place of what the page says it printed.

A command is left as it is (the README's output kept, the reason listed) when it cannot
run here unattended: a server that runs until stopped (``tuner sim-serve``, ``curl`` to
it), a benchmark of its own (``python benchmarks/...``, minutes to hours: run it and paste
by hand), a database server in the URL, an elided ``...`` in the command line, or a
transcript preceded by ``<!-- output: keep -->`` (one preceded by ``<!-- output: run -->`` runs whatever it is:
a benchmark that only reports committed data). A transcript preceded by ``<!-- output: real time -->``
(a search against ``tuner sim-serve`` in real time, whose figures are the machine's) is regenerated
but not compared by ``--check``.

    python benchmarks/readme_outputs.py            # a unified diff of the pages against now
    python benchmarks/readme_outputs.py --write    # write them
    python benchmarks/readme_outputs.py --check    # exit 1 naming each output that differs (run time masked;
                                                   # real-time runs not compared): what tests/test_docs.py runs
    python benchmarks/readme_outputs.py --list     # the commands, and which would be kept

The checkout's ``tuner/`` is linked into the temporary folder, as a clone has it (README reads the
traces shipped in ``tuner/data/traces``); files
the README assumes but does not show (``bad.csv``) are written there first.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: The docs pages in the order a reader meets them (a later page's commands use an earlier one's study).
PAGES = ("study", "capacity", "traffic", "fleet", "real-gpus", "inspect", "nightly", "simulator", "benchmarks",
         "development")
KEEP_MARK = "<!-- output: keep -->"
REAL_TIME_MARK = "<!-- output: real time -->"
RUN_MARK = "<!-- output: run -->"  # a quick benchmark (a report of committed data) that runs, and is compared, anyway
#: A run time printed by a command ("42 new in 28.6 s", "in 0.4 s", "took 13.5 s of CPU (26.0 s wall): search
#: 7.8 s, ..."): the machine's, masked by --check. Every other figure is the code's.
DURATION = re.compile(r"\b(in )\d[\d,]*(?:\.\d+)? s\b")
TOOK = re.compile(r"^took .*")
#: Files the README's commands read without showing how they were made.
FIXTURES = {
    # an Azure trace whose second data row (line 3) has a token count that is not a number
    "bad.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n"
               "2023-11-16 18:15:46.6805900,374,44\n"
               "2023-11-16 18:15:50.9951690,12x,39\n",
}
#: Why a command is kept, by what its line holds.
KEEP = (
    (re.compile(r"^tuner sim-serve\b"), "a server that runs until stopped"),
    (re.compile(r"^curl\b"), "asks the server above"),
    (re.compile(r"^python3? benchmarks/"), "a benchmark of its own: run it and paste by hand"),
    (re.compile(r"postgresql://"), "needs a database server"),
    (re.compile(r"\s\.\.\.\s"), "the command line is elided"),
)


@dataclass
class Command:
    """One ``$`` command of a transcript and the output lines the README shows for it."""

    lines: list[str]  # as written, "$ " included
    output: list[str] = field(default_factory=list)
    keep: str | None = None  # why it is not run
    real_time: bool = False  # run, but its figures are the machine's: not compared by --check
    new_output: list[str] | None = None

    @property
    def text(self) -> str:
        """The command as bash reads it."""
        return "\n".join([self.lines[0][2:], *self.lines[1:]])


@dataclass
class Transcript:
    start: int  # line index of the opening fence
    end: int    # line index of the closing fence
    commands: list[Command]


def _heredoc_end(line: str) -> str | None:
    found = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
    return found.group(1) if found else None


def parse(lines: list[str]) -> list[Transcript]:
    """The transcripts of README ``lines``."""
    found, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("```text"):
            i += 1
            continue
        start = i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```")
        body = lines[start + 1:end]
        commands: list[Command] = []
        k = 0
        while k < len(body):
            if not body[k].startswith("$ "):
                if commands:
                    commands[-1].output.append(body[k])
                k += 1
                continue
            cmd = Command([body[k]])
            marker = _heredoc_end(body[k])
            while cmd.lines[-1].endswith("\\") and k + 1 < len(body):
                k += 1
                cmd.lines.append(body[k])
            if marker:
                while k + 1 < len(body) and body[k].strip() != marker:
                    k += 1
                    cmd.lines.append(body[k])
            commands.append(cmd)
            k += 1
        if commands:
            mark = lines[start - 1].strip() if start > 0 else ""
            for cmd in commands:
                first = cmd.lines[0][2:].strip()
                cmd.keep = "marked <!-- output: keep -->" if mark == KEEP_MARK else None if mark == RUN_MARK else next(
                    (why for pattern, why in KEEP if pattern.search(first)), None)
                cmd.real_time = mark == REAL_TIME_MARK
            found.append(Transcript(start, end, commands))
        i = end + 1
    return found


def _env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNER_", "FORCE_COLOR"))}
    env.update(COLUMNS="80", LINES="50", TERM="dumb", NO_COLOR="1", MPLBACKEND="Agg",
               PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT))
    return env


def run(transcripts: list[Transcript], *, timeout_s: float) -> None:
    """Run every command not kept, in order, in one fresh folder; fill ``new_output``."""
    bin_dir = Path(sys.executable).parent  # the environment tuner is installed in
    with tempfile.TemporaryDirectory(prefix="readme-outputs-") as tmp:
        work = Path(tmp) / "tuner"
        work.mkdir()
        for folder in ("tuner", "search_spaces", "benchmarks", "docs"):  # what a clone's root holds
            (work / folder).symlink_to(ROOT / folder)
        for name, text in FIXTURES.items():
            (work / name).write_text(text, encoding="utf-8")
        env = _env(bin_dir)
        for t in transcripts:
            for cmd in t.commands:
                if cmd.keep:
                    continue
                print(f"running: {cmd.lines[0][2:]}", file=sys.stderr, end="", flush=True)
                t0 = time.perf_counter()
                done = subprocess.run(["bash", "-c", cmd.text], cwd=work, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=timeout_s, check=False)
                print(f"   ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
                text = done.stdout.replace(str(work) + "/", "").replace(str(Path(tmp)), "..")
                cmd.new_output = [line.rstrip() for line in text.rstrip("\n").splitlines()]


def rewrite(lines: list[str], transcripts: list[Transcript]) -> list[str]:
    """README ``lines`` with each run command's output replaced."""
    out = list(lines)
    for t in reversed(transcripts):
        body: list[str] = []
        for cmd in t.commands:
            body += cmd.lines
            body += cmd.output if cmd.new_output is None else cmd.new_output
        out[t.start + 1:t.end] = body
    return out


@dataclass
class Page:
    """One page (README.md or a docs page) and its transcripts."""

    path: Path
    lines: list[str]
    transcripts: list[Transcript]

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT)) if self.path.is_relative_to(ROOT) else str(self.path)


def pages(paths: list[Path] | None = None) -> list[Page]:
    """README.md and the docs pages in reading order (:data:`PAGES`, then the rest by name), or ``paths``."""
    if paths is None:
        docs = sorted((ROOT / "docs").glob("*.md"))
        order = {name: k for k, name in enumerate(PAGES)}
        paths = [README] + sorted(docs, key=lambda d: (order.get(d.stem, len(PAGES)), d.stem))
    out = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        out.append(Page(path, lines, parse(lines)))
    return out


def masked(lines: list[str] | None) -> list[str] | None:
    return None if lines is None else [TOOK.sub("took ...", DURATION.sub(r"\1N s", line)) for line in lines]


def differences(page: Page, *, compare_real_time: bool = True) -> list[str]:
    """``page:line: command`` for each command run whose output differs from the page's (run times masked)."""
    return [f"{page.name}:{t.start + 1}: {cmd.lines[0][2:]}" for t in page.transcripts for cmd in t.commands
            if cmd.new_output is not None and (compare_real_time or not cmd.real_time)
            and masked(cmd.new_output) != masked(cmd.output)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the pages (default: print a diff)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if an output differs (run times masked, real-time runs not compared)")
    parser.add_argument("--list", action="store_true", help="list the commands, and which are kept; run nothing")
    parser.add_argument("--page", type=Path, action="append", help="only these pages, in this order (repeatable)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one command may take")
    args = parser.parse_args(argv)
    docs = pages([p.resolve() for p in args.page] if args.page else None)
    if args.list:
        for page in docs:
            for t in page.transcripts:
                for cmd in t.commands:
                    why = f"   [kept: {cmd.keep}]" if cmd.keep else "   [real time]" if cmd.real_time else ""
                    print(f"{page.name}:{t.start + 1}: {cmd.lines[0][2:]}{why}")
        return 0
    run([t for page in docs for t in page.transcripts], timeout_s=args.timeout)
    changed = [d for page in docs for d in differences(page, compare_real_time=not args.check)]
    print(f"{len(changed)} command outputs differ:", file=sys.stderr)
    for line in changed:
        print(f"  {line}", file=sys.stderr)
    for page in docs:
        new = rewrite(page.lines, page.transcripts)
        if args.write:
            page.path.write_text("\n".join(new) + "\n", encoding="utf-8")
        elif not args.check:
            sys.stdout.writelines(difflib.unified_diff([x + "\n" for x in page.lines], [x + "\n" for x in new],
                                                       page.name, f"{page.name} (regenerated)"))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())

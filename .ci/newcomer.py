"""README's two commands as a newcomer types them, checked: a fresh clone of the commit under test in an
empty temporary folder (nothing beside it, no ../shared), a fresh virtual environment, each command run
through a pseudo-terminal (stdin, stdout and stderr a TTY, TERM set, a window of 80 or 200 columns).

    python3 .ci/newcomer.py                  # the clone of HEAD in a temporary folder, removed afterwards
    python3 .ci/newcomer.py --keep DIR       # in DIR (left there, with a log of each step)
    python3 .ci/newcomer.py --skip-tests     # the main job and Ctrl-C only (a minute, not the suite)

Steps (each prints its exit code and time; the first failure ends the job with exit 1):
1. README's main-job command (`... pip install -e . -c constraints.txt && tuner search --budget 40`), 80 columns:
   exit 0, no traceback, the progress bar drawn, and stdout equal to README's pasted transcript line by line
   (run time masked: the one figure that is not the simulator's; every other figure must match exactly).
2. `tuner search` interrupted with Ctrl-C in the terminal once a trial has finished (200 columns): exit 130, one
   line, no traceback; the same command again resumes the study and finishes its budget, exit 0.
3. README's test command (`... pip install -q -e '.[test]' -c constraints.txt && pytest -q`), 200 columns:
   exit 0 and no test failed.

Standard library only (it runs before anything is installed). The environment given to the commands is a
newcomer's: no virtual environment active, no PYTHONPATH; variables naming services CI starts
(TUNER_TEST_POSTGRES_URL) pass through.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]|\x1b[=>]")
PASS_THROUGH = ("HOME", "LANG", "LC_ALL", "USER", "LOGNAME", "SHELL", "TMPDIR", "PIP_INDEX_URL", "PIP_FIND_LINKS",
                "PIP_EXTRA_INDEX_URL", "PIP_DISABLE_PIP_VERSION_CHECK", "TUNER_TEST_POSTGRES_URL", "MPLBACKEND")


class Failed(Exception):
    """A step did not do what README says."""


def newcomer_env() -> dict[str, str]:
    """A login-like environment: PATH without any virtual environment, a terminal type, nothing of tuner's."""
    venv = os.environ.get("VIRTUAL_ENV")
    path = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if p and not (venv and p.startswith(venv)) and "/.venv" not in p]
    env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
    env.update(PATH=os.pathsep.join(path), TERM="xterm-256color")
    return env


def run_in_pty(command: str, cwd: Path, *, cols: int, timeout_s: float, log: Path,
               react=None) -> tuple[int, str]:
    """``bash -c command`` with a pseudo-terminal as its stdin, stdout and stderr, a window ``cols`` wide.
    ``react(text_so_far)`` may return bytes to type into the terminal (once). Returns (exit code, output)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its controlling tty
        try:
            # a login shell's dispositions: a signal this process ignores (Python ignores SIGPIPE; a caller
            # may ignore SIGINT) would stay ignored across exec, and Ctrl-C would do nothing
            for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
            os.chdir(cwd)
            os.execvpe("bash", ["bash", "-c", command], newcomer_env())
        finally:
            os._exit(127)
    chunks: list[bytes] = []
    deadline, typed = time.monotonic() + timeout_s, False
    with log.open("wb") as out:
        while True:
            if time.monotonic() > deadline:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
                raise Failed(f"{command!r} still running after {timeout_s:.0f} s (log: {log})")
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the child side is closed
                    data = b""
                if not data:
                    break
                chunks.append(data)
                out.write(data)
                if react and not typed:
                    keys = react(b"".join(chunks).decode("utf-8", "replace"))
                    if keys:
                        os.write(fd, keys)
                        typed = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    code = os.waitstatus_to_exitcode(status)
    return (128 - code if code < 0 else code), b"".join(chunks).decode("utf-8", "replace")  # a signal as a shell says it  # noqa: E501


def screen_lines(raw: str) -> list[str]:
    """The lines as the terminal leaves them, roughly: escapes removed, a carriage return overwrites its line."""
    text = ANSI.sub("", raw).replace("\r\n", "\n")
    return [line.split("\r")[-1].rstrip() for line in text.split("\n")]


def readme_block(after: str, lang: str = "bash") -> str:
    """The first fenced block of ``lang`` in README.md after the line that contains ``after``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(after)
    m = re.compile(rf"^```{lang}\n(.*?)^```", re.M | re.S).search(text, start)
    if not m:
        raise Failed(f"README.md: no ```{lang} block after {after!r}")
    return m.group(1)


def readme_commands() -> tuple[str, str]:
    """README's two commands: the one that runs the main job and the one that runs the tests."""
    main_job = readme_block("Install and run the main job").strip()
    tests = readme_block("Install and run the tests").strip()
    if "tuner search --budget 40" not in main_job or "pytest" not in tests:
        raise Failed("README.md's quick start no longer holds the two commands this job runs")
    return main_job, tests


def readme_transcript(command: str) -> list[str]:
    """The output README pastes under ``$ command`` (the first ```text block holding that line), up to the
    block's end or the next command."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for m in re.finditer(r"^```text\n(.*?)^```", text, re.M | re.S):
        lines = [line.rstrip() for line in m.group(1).rstrip("\n").split("\n")]
        if f"$ {command}" in lines:
            rest = lines[lines.index(f"$ {command}") + 1:]
            return rest[:next((i for i, line in enumerate(rest) if line.startswith("$ ")), len(rest))]
    raise Failed(f"README.md has no transcript of `{command}`")


DURATION = re.compile(r"\b(in )\d+(?:\.\d+)? s\b")


def masked(lines: list[str]) -> list[str]:
    """Lines with the run time masked ("42 new in 28.6 s" -> "42 new in N s"): the time a run took is the
    machine's; every other figure of a simulator run is the code's, and must match."""
    return [DURATION.sub(r"\1N s", line) for line in lines]


def check_transcript(out: str, command: str) -> None:
    want = masked(readme_transcript(command))
    lines = screen_lines(out)
    starts = [i for i, line in enumerate(lines) if line.startswith(want[0].split()[0] + " ")]
    if not starts:
        raise Failed(f"the output has no line starting like README's first line {want[0]!r}")
    got = masked(lines[starts[-1]:starts[-1] + len(want)])
    diff = [f"  README: {w!r}\n  now:    {g!r}" for w, g in zip(want, got + [""] * len(want)) if w != g]
    if diff:
        raise Failed(f"the output differs from README's transcript of `{command}` in {len(diff)} line(s):\n"
                     + "\n".join(diff[:8]) + "\n(regenerate README with: python benchmarks/readme_outputs.py --write)")


def check_clean(code: int, out: str, what: str, want: int = 0) -> None:
    if "Traceback (most recent call last)" in out:
        tail = "\n".join(screen_lines(out)[-25:])
        raise Failed(f"{what}: a Python traceback on the terminal:\n{tail}")
    if code != want:
        tail = "\n".join(screen_lines(out)[-25:])
        raise Failed(f"{what}: exit {code}, README promises {want}:\n{tail}")


def step(name: str, fn) -> None:
    t0 = time.monotonic()
    print(f"newcomer: {name} ...", flush=True)
    fn()
    print(f"newcomer: {name}: ok ({time.monotonic() - t0:.0f} s)", flush=True)


def main_job(clone: Path, logs: Path, command: str) -> None:
    code, out = run_in_pty(command, clone, cols=80, timeout_s=900, log=logs / "main-job.log")
    check_clean(code, out, "README's main-job command")
    if not re.search(r"trials\b.*\b40/40\b", "\n".join(screen_lines(out))):
        raise Failed("the progress bar was not drawn on the terminal (no 'trials ... 40/40')")
    check_transcript(out, "tuner search --budget 40")


def interrupt_and_resume(clone: Path, logs: Path) -> None:
    command = ". .venv/bin/activate && tuner search --budget 12 --study newcomer-ctrl-c"

    def after_first_trial(text: str) -> bytes | None:
        done = re.findall(r"\b(\d+)/12\b", ANSI.sub("", text))
        return b"\x03" if any(int(n) >= 1 for n in done) else None

    code, out = run_in_pty(command, clone, cols=200, timeout_s=600, log=logs / "ctrl-c.log", react=after_first_trial)
    check_clean(code, out, "tuner search interrupted with Ctrl-C", want=130)
    code, out = run_in_pty(command, clone, cols=200, timeout_s=600, log=logs / "resume.log")
    check_clean(code, out, "tuner search resumed after Ctrl-C")
    if not re.search(r"\b12\s+finished trials\b", " ".join(screen_lines(out))):
        raise Failed("the resumed study does not report its 12 finished trials")


def test_command(clone: Path, logs: Path, command: str) -> None:
    code, out = run_in_pty(command, clone, cols=200, timeout_s=2400, log=logs / "tests.log")
    check_clean(code, out, "README's test command")
    summary = [line for line in screen_lines(out) if re.search(r"\d+ passed", line)]
    if not summary or re.search(r"\d+ (failed|errors?)\b", summary[-1]):
        raise Failed(f"README's test command: {summary[-1] if summary else 'no pytest summary'}")
    print(f"newcomer: pytest: {summary[-1].strip(' =')}", flush=True)


def run(workdir: Path, *, skip_tests: bool) -> None:
    main_cmd, test_cmd = readme_commands()
    clone, logs = workdir / "tuner", workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"newcomer: a fresh clone of {head.stdout.strip()} in {clone} (nothing beside it: "
          f"{sorted(p.name for p in workdir.iterdir())})", flush=True)
    step("README's main-job command in a terminal (80 columns)", lambda: main_job(clone, logs, main_cmd))
    step("tuner search, Ctrl-C in the terminal, then resumed (200 columns)", lambda: interrupt_and_resume(clone, logs))
    if not skip_tests:
        step("README's test command in a terminal (200 columns)", lambda: test_command(clone, logs, test_cmd))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="work in this (empty or new) folder and leave it there")
    parser.add_argument("--skip-tests", action="store_true", help="skip README's test command (the whole suite)")
    args = parser.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="tuner-newcomer-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        run(workdir.resolve(), skip_tests=args.skip_tests)
    except Failed as e:
        print(f"newcomer: FAILED: {e}", flush=True)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print("newcomer: README's commands work on a fresh clone in a terminal", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

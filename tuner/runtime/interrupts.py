"""Stop requests from outside: signals (what ``timeout``, systemd and cron send) and the
run's wall-clock limit, turned into one exception that unwinds the search cleanly.

:class:`Interrupted` derives from ``KeyboardInterrupt`` on purpose: Optuna marks the
running trial FAIL for it (as for Ctrl-C) and re-raises it even when the study catches
``Exception``; every ``with instance:`` on the way out stops that trial's servers. The
search records such a trial as ``interrupted``: it does not use the budget, teaches the
sampler nothing, and its configuration is measured again when the study resumes.

:func:`handle_signals` (main thread only; the CLI uses it) maps SIGTERM and SIGHUP to
:class:`Interrupted` and raises it once: a second signal while the servers are being
stopped is remembered, not raised, so the cleanup itself is not cut short.
"""
from __future__ import annotations

import contextlib
import contextvars
import signal
import threading
import time
from collections.abc import Iterator

#: Exit status per reason: 128 + the signal's number, as shells report it.
EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129, "timeout": 124}


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop (``reason``: SIGINT, SIGTERM, SIGHUP or timeout)."""

    def __init__(self, reason: str = "SIGINT") -> None:
        super().__init__(reason)
        self.reason = reason

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.reason, 130)


_state = threading.local()


def _raised() -> bool:
    return bool(getattr(_state, "raised", False))


class Caught:
    """What :func:`handle_signals` saw: the :class:`Interrupted` it raised, if any."""

    def __init__(self) -> None:
        self.interrupt: Interrupted | None = None


@contextlib.contextmanager
def handle_signals() -> Iterator[Caught]:
    """Within the block SIGINT, SIGTERM, SIGHUP and SIGALRM (see :func:`alarm`) raise
    :class:`Interrupted`, once: a signal while unwinding is ignored so the servers'
    shutdown is not cut short. Yields a :class:`Caught` naming the interruption (the
    CLI's framework turns KeyboardInterrupt into a bare exit status; this keeps the
    reason). Outside the main thread this does nothing (Python delivers signals there)."""
    caught = Caught()
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    _state.raised = False

    def handler(signum: int, frame: object) -> None:
        if _raised():
            return  # already unwinding: let the cleanup finish
        _state.raised = True
        name = signal.Signals(signum).name
        caught.interrupt = Interrupted("timeout" if name == "SIGALRM" else name)
        raise caught.interrupt

    sigs = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGALRM)
    old = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, handler)
    _state.installed = True
    try:
        yield caught
    finally:
        _state.installed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, h in old.items():
            signal.signal(s, h)


def hold_signals() -> None:
    """From now on, signals inside :func:`handle_signals` are ignored (the last cleanup)."""
    _state.raised = True


def alarm(seconds: float | None) -> None:
    """Raise :class:`Interrupted` ("timeout") after ``seconds`` wherever the run is (a
    start that hangs, a replay nobody answers): the hard bound behind the cooperative
    :class:`Deadline` checks. Only inside :func:`handle_signals`."""
    if not getattr(_state, "installed", False) or threading.current_thread() is not threading.main_thread():
        return  # without our handler, SIGALRM would kill the process
    signal.setitimer(signal.ITIMER_REAL, 0 if seconds is None else max(seconds, 0.001))


class Deadline:
    """A wall-clock limit (``None``: none). ``remaining()`` is the seconds left (inf
    without a limit); ``check()`` raises :class:`Interrupted` ("timeout") once it passed."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float:
        return float("inf") if self.at is None else self.at - time.monotonic()

    def passed(self) -> bool:
        return self.remaining() <= 0

    def check(self) -> None:
        if self.passed():
            raise Interrupted("timeout")


_NO_DEADLINE = Deadline(None)
_current: contextvars.ContextVar[Deadline] = contextvars.ContextVar("tuner_deadline", default=_NO_DEADLINE)


def current_deadline() -> Deadline:
    """The deadline of the run in progress (none outside :func:`deadline_scope`): what a
    backend's start and a replay must not outlast."""
    return _current.get()


@contextlib.contextmanager
def deadline_scope(deadline: Deadline) -> Iterator[Deadline]:
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)


__all__ = ["Caught", "Deadline", "EXIT_CODES", "Interrupted", "alarm", "current_deadline", "deadline_scope",
           "handle_signals", "hold_signals"]

"""The ``tuner`` command. Each command group lives in its own module and registers
itself on :data:`~tuner.cli.app.app` when :func:`main` imports it; commands stay thin and call the same library functions that
notebooks call. Errors print one line (``tuner: ...``) and exit with the error's code
(2 bad input, 3 no feasible configuration, 5 an endpoint that cannot be talked to, 1 otherwise); ``--debug`` shows the traceback.
"""  # noqa: E501
from __future__ import annotations

import os
import sys

import typer

from tuner.cli.app import app
from tuner.cli.commands import register
from tuner.cli.options import as_flag
from tuner.core.errors import TunerError, TunerWarning
from tuner.core.urls import redact
from tuner.runtime.interrupts import handle_signals, hold_signals


def _register(argv: list[str] | None = None) -> None:
    """Each module adds its commands to `app` on import: the one ``argv`` names, else all."""
    register(argv)


def main(argv: list[str] | None = None) -> None:
    """Entry point. Typer handles usage errors itself (exit 2); TunerError becomes one
    line. SIGINT, SIGTERM and SIGHUP stop the run cleanly (:mod:`tuner.runtime.interrupts`): the
    trial in progress is stopped with its servers and not counted, one line says so, and
    the exit status is 128 + the signal (130, 143, 129). A reader of stdout that went away
    (``tuner ... | head``) ends it as ``cat`` ends: quietly, by SIGPIPE (141 in the shell).
    Whatever the exit, no server this process started is left running."""

    argv = _debug_anywhere(list(sys.argv[1:] if argv is None else argv))
    _one_line_warnings()
    _register(argv)
    code: int | str | None = 0
    with handle_signals() as caught:
        try:
            result = app(args=argv, prog_name="tuner", standalone_mode=False)
            code = result if isinstance(result, int) else 0  # typer.Exit and --help return their code
            sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at interpreter exit
        except typer.TyperException as err:  # click's usage errors (a bad choice, a missing argument)
            code = _usage_error(err)
        except typer.Abort:
            code = 1
        except TunerError as err:
            if os.environ.get("TUNER_DEBUG"):
                raise

            print(f"tuner: {redact(str(as_flag(err)))}", file=sys.stderr)
            code = err.exit_code
        except SystemExit as err:  # typer's own exit (also what it makes of KeyboardInterrupt)
            code = _PIPE if _closed_pipe(err) else err.code  # click exits 1 on EPIPE
        except BrokenPipeError:
            code = _PIPE
        except Exception as err:  # a study database that cannot be read or written, anywhere
            from tuner.study.storage import storage_fault  # the study package, on this error path only

            fault = storage_fault(err, _storage_arg(argv))
            if fault is None or os.environ.get("TUNER_DEBUG"):
                raise

            print(f"tuner: {redact(str(fault))}", file=sys.stderr)
            code = fault.exit_code
        except KeyboardInterrupt as err:
            caught.interrupt = caught.interrupt or err  # type: ignore[assignment]
        finally:
            hold_signals()  # only cleanup is left: a further signal must not cut it short
            _stop_servers()
    if caught.interrupt is not None:
        print(f"tuner: {_interrupted_line(caught.interrupt)}", file=sys.stderr)
        code = getattr(caught.interrupt, "exit_code", 130)
    if code is _PIPE:
        _die_of_sigpipe()
    sys.exit(code)


#: The exit of a command whose stdout reader went away (:func:`_die_of_sigpipe`).
_PIPE = "closed pipe"


def _closed_pipe(err: BaseException) -> bool:
    """``err`` (or what it was raised while handling: click turns EPIPE into ``exit(1)``)
    is a write to a pipe nobody reads any more."""
    import errno

    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.EPIPE:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _die_of_sigpipe() -> None:
    """End as ``cat`` does when its reader is gone: stdout is pointed at /dev/null (so that
    Python's last flush does not complain), and the process is killed by SIGPIPE."""
    import signal

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sigpipe = getattr(signal, "SIGPIPE", None)
    if sigpipe is None:  # no such signal (Windows): the shell's code for it
        sys.exit(128 + 13)
    sys.stderr.flush()
    signal.signal(sigpipe, signal.SIG_DFL)
    os.kill(os.getpid(), sigpipe)
    sys.exit(128 + sigpipe)  # not reached once the signal is delivered


def _one_line_warnings() -> None:
    """A :class:`TunerWarning` prints as one line, ``tuner: warning: ...``, not as Python's
    two lines with our source file; other warnings keep Python's form."""
    import warnings

    shown = warnings.showwarning
    if getattr(shown, "tuner", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if issubclass(category, TunerWarning):
            print(f"tuner: warning: {message}", file=file or sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    show.tuner = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def _usage_error(err: typer.TyperException) -> int:
    """A usage error as every tuner error: one line, ``tuner: ...``, with the command whose
    --help lists the choices; with no arguments at all, the help itself."""
    ctx = getattr(err, "ctx", None)
    if type(err).__name__ == "NoArgsIsHelpError":
        err.show()  # type: ignore[attr-defined]
    else:
        where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        message = err.format_message().rstrip(".").replace("Value error, ", "")  # typer's validation prefix
        print(f"tuner: {message[:1].lower()}{message[1:]}{where}", file=sys.stderr)
    return getattr(err, "exit_code", 2)


def _debug_anywhere(argv: list[str]) -> list[str]:
    """``--debug`` is accepted after the command too (``tuner trace stats bad.csv --debug``):
    it is moved to the front, where the root option reads it. Not past ``--``."""
    end = argv.index("--") if "--" in argv else len(argv)
    if "--debug" not in argv[:end]:
        return argv
    return ["--debug", *(a for i, a in enumerate(argv) if a != "--debug" or i >= end)]


def _storage_arg(argv: list[str] | None) -> str:
    """The ``--storage`` the command was given, for messages (else the default folder)."""
    args = list(sys.argv[1:] if argv is None else argv)
    for i, a in enumerate(args):
        if a == "--storage" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--storage="):
            return a.split("=", 1)[1]
    return "studies/"


def _interrupted_line(err: BaseException) -> str:
    reason = getattr(err, "reason", "SIGINT")
    trial = getattr(err, "trial", None)
    where = (f"; trial {trial} was stopped with its servers (not counted: it is measured again when the "
             "study resumes)") if trial is not None else ""
    return f"interrupted by {reason}{where}; finished trials are kept in the study"


def _stop_servers() -> None:
    """Last resort on every exit: stop servers this process started and still holds."""
    import sys as _sys

    vllm = _sys.modules.get("tuner.backends.vllm_replica")
    if vllm is not None:
        left = vllm.stop_all()
        if left:
            print(f"tuner: stopped {left} server(s) still running on exit", file=sys.stderr)

"""One root for every error the user can cause or meet.

Each message is written for the person at the keyboard: what was wrong, where
(``file:line`` for bad input), and what to do. The CLI prints ``str(error)`` on one
line and exits with ``error.exit_code``; the traceback appears only with ``--debug``.
"""
from __future__ import annotations

from pathlib import Path


class TunerError(Exception):
    """Root of all tuner errors. ``str(err)`` is a complete one-line message."""

    exit_code = 1


class TunerWarning(UserWarning):
    """Something the run went on without, said once on one line (``tuner: warning: ...``):
    a file it passed over, with its ``file:line``."""


class InputError(TunerError):
    """Bad input: a malformed trace row, a bad search space, an unknown flag value.

    ``InputError("negative length", path="t.csv", line=7, hint="use --skip-bad")``
    reads ``t.csv:7: negative length (use --skip-bad)``.

    ``argument`` names the library argument a message starts with (``InputError("budget must
    be >= 1, got 0", argument="budget")``): a notebook reads the argument it passed, and the
    command line says the flag it maps to (:meth:`for_flag`: ``--budget must be >= 1, got 0``).
    """

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        hint: str | None = None,
        argument: str | None = None,
    ) -> None:
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        self.hint = hint
        self.argument = argument
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        text = f"{where}{message}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)

    def for_flag(self, flag: str, hint: str | None = None) -> InputError:
        """The same error as the command line says it: its argument, where the message first
        names it, named by its ``flag`` (``budget must be >= 1`` -> ``--budget must be >= 1``),
        and ``hint`` in place of the library's where given."""
        import re

        message = self.message
        if self.argument:  # its first mention, where the message names it
            message = re.sub(rf"(?<![\w-]){re.escape(self.argument)}(?![\w-])", flag, message, count=1)
        return InputError(message, path=self.path, line=self.line, hint=hint or self.hint)


class ConfigRejected(TunerError):
    """vLLM refuses (or would refuse) to start with this configuration.

    ``kind`` is a short machine-readable cause the search learns from:
    ``oom``, ``no_kv_memory``, ``max_model_len``, ``dtype``, ``quantization``,
    ``tensor_parallel``, ``block_size``, ``batch_tokens``, ``bad_flag``,
    ``layout``, ``attention``, ``timeout``, ``crash``. ``message`` carries vLLM's own wording.
    ``estimated_max_model_len`` is set for ``max_model_len`` refusals.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        estimated_max_model_len: int | None = None,
        log_path: str | None = None,
    ) -> None:
        self.kind = kind
        self.message = message
        self.estimated_max_model_len = estimated_max_model_len
        self.log_path = log_path
        text = f"vLLM would not start ({kind}): {message}"
        if log_path:
            text += f" [log: {log_path}]"
        super().__init__(text)


class BackendError(TunerError):
    """A server could not be reached, died mid-run, or misbehaved."""


class NoFeasibleConfig(TunerError):
    """The study finished without any configuration meeting the target."""

    exit_code = 3


class WindowClosed(TunerError):
    """``--timeout`` ended the run before the study held its budget: no trial was started
    that the study's own trial durations said could not finish; the next run goes on."""

    exit_code = 124


class EnvironmentFault(TunerError):
    """Something around the configuration failed, not the configuration: a port taken by
    another process, a command that does not exist or rejects tuner's flags, a full or
    read-only disk, a storage that cannot be written, a server that is not the one tuner
    started. Never recorded as an infeasible configuration: a trial that meets one fails
    as ``environment`` (not counted against the budget, nothing taught to the sampler,
    measured again later); found before the first trial, it stops the run (exit 2).

    ``kind``: ``port_in_use``, ``foreign_server``, ``command``, ``bad_flag``, ``disk_full``,
    ``storage``, ``gpu``, ``gpu_busy`` (memory other processes hold), ``before_engine`` (a
    death before vLLM's engine started), ``killed`` (a signal tuner did not send; the trial
    is measured again once), ``startup_timeout`` (no configuration has started yet),
    ``same_failure`` (configurations that differ failed alike), ``stale_server``, ``disrupted``
    (:class:`Disrupted`), ``control`` (a configuration known to work failed too), ``undecided``
    (nothing has worked yet to tell). ``blame`` and ``gpu_s``, when set, say how it was
    judged and what the starts it took cost (:mod:`tuner.search.blame`).
    ``retry`` says whether trying again (another port) may help."""

    exit_code = 2

    def __init__(self, kind: str, message: str, *, retry: bool = False, path: str | None = None) -> None:
        self.kind = kind
        self.message = message
        self.retry = retry
        self.path = path
        self.blame: dict | None = None
        self.gpu_s = 0.0
        super().__init__(message)


class Disrupted(EnvironmentFault):
    """A measurement something outside the configuration cut into: the server exited or
    stopped answering mid-replay without tuner's signal, or every stream stalled at the
    same instant for longer than the serving ever pauses (a SIGSTOP, a host that swapped).
    Never stored as a result: the search measures the configuration again on a fresh start,
    and a control run decides whose fault a second one is (:mod:`tuner.search.blame`)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__("disrupted", message, path=path)


class EndpointFault(EnvironmentFault):
    """The server at ``--endpoint`` cannot be talked to: it refuses connections, resets
    them, does not answer in time, or sends streams whose tokens do not arrive as its own
    usage claims (``bad_stream``). The server's fault, never the configuration's (an
    endpoint study applies no configuration): the trial in progress fails as
    ``environment`` (not counted) and the run stops at once with exit 5, one line naming
    the URL and the cause.

    ``kind``: ``refused``, ``reset``, ``timeout``, ``unreachable``, ``bad_stream``."""

    exit_code = 5

    def __init__(self, kind: str, url: str, cause: str) -> None:
        self.url = url
        self.cause = cause
        super().__init__(kind, f"endpoint {url}: {cause}; nothing about the configuration was learnt "
                         "(fix the server or the URL and run the same command again)")


def connection_cause(err: BaseException) -> tuple[str, str]:
    """``(kind, words)`` for an error met while connecting to or reading from a server:
    refused, reset, timeout or unreachable, with the system's own wording."""
    import socket

    reason = getattr(err, "reason", None)  # urllib wraps the socket error
    inner = reason if isinstance(reason, BaseException) else err
    text = str(reason if reason is not None else err)
    if isinstance(inner, ConnectionRefusedError) or "refused" in text.lower():
        return "refused", f"connection refused ({text})"
    if isinstance(inner, ConnectionResetError) or "reset" in text.lower():
        return "reset", f"connection reset ({text})"
    if isinstance(inner, (TimeoutError, socket.timeout)) or "timed out" in text.lower():
        return "timeout", f"no answer in time ({text})"
    return "unreachable", f"cannot be reached ({text})"

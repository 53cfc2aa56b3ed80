"""The ``tuner`` command. Each command group lives in its own module and registers
itself on :data:`app`; commands stay thin and call the same library functions that
notebooks call. Errors print one line (``tuner: ...``) and exit with the error's code
(2 bad input, 3 no feasible configuration, 1 otherwise); ``--debug`` shows the traceback.
"""
from __future__ import annotations

import os
import sys

import typer

from tuner.errors import TunerError

app = typer.Typer(
    name="tuner",
    help=(
        "Find the vLLM serving configuration with the most token throughput while P95 "
        "time-to-first-token stays under a target, and plan how much traffic it holds.\n\n"
        "Runs on an embedded simulator of vLLM by default (no GPU needed); "
        "--backend vllm restarts real vLLM for each trial."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    if debug:
        os.environ["TUNER_DEBUG"] = "1"


def _register() -> None:
    # Each module adds its commands to `app` on import.
    from tuner.cli import commands  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    """Entry point. Typer handles usage errors itself (exit 2); TunerError becomes one line."""
    _register()
    try:
        app(args=argv, prog_name="tuner")
    except TunerError as err:
        if os.environ.get("TUNER_DEBUG"):
            raise
        print(f"tuner: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("tuner: interrupted; finished trials are kept in the study", file=sys.stderr)
        sys.exit(130)

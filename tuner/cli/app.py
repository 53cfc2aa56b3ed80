"""The ``tuner`` Typer application, which every command module adds its commands to."""
from __future__ import annotations

import os

import typer

from tuner import __version__
from tuner.serving.config import DEFAULT_VLLM_VERSION

app = typer.Typer(
    name="tuner",
    help=(
        "Find the vLLM serving configuration with the most token throughput while P95 "
        "time-to-first-token stays under a target, and plan how much traffic it holds.\n\n"
        "Runs on an embedded simulator of vLLM by default (no GPU needed); "
        "--backend vllm restarts real vLLM for each trial.\n\n"
        "A flag means the same in every command that has it: -o/--output how the result "
        "prints (text or json on stdout), --out where files are written (a folder, or "
        "export's file), --gpus a count or device ids, -c/--concurrency users and --rate "
        "requests/s (comma-separated), --timeout how long to go on starting trials (2h, 45m). "
        "Progress goes to stderr."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's own help layout: it wraps help text and never cuts an option name (rich's
    # table squeezes names to "--gpu-memory-utili…" at 80 columns) and shows no metavar
    # on flags; every sub-Typer says the same
    rich_markup_mode=None,
)


def _version(shown: bool) -> None:
    """``tuner --version``: one line, what a bug report needs (tuner, the vLLM version the
    simulator defaults to, Python, Optuna), then exit 0."""
    if not shown:
        return
    import platform
    from importlib.metadata import version

    typer.echo(f"tuner {__version__} (simulates vLLM {DEFAULT_VLLM_VERSION} by default; Python "
               f"{platform.python_version()}, optuna {version('optuna')})")
    raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                 help="Show tuner's version and exit."),
) -> None:
    if debug:
        os.environ["TUNER_DEBUG"] = "1"


__all__ = ["app"]

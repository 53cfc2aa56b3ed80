"""The choices that several commands take, as enums: ``--help`` lists them, click refuses
anything else in one line (``tuner: invalid value for '--backend': ...``), and each
option means the same in every command that has it."""
from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from tuner.core.errors import InputError


class Backend(str, Enum):
    """What a trial or a plan runs on."""

    sim = "sim"            # the embedded simulator of vLLM: no GPU
    vllm = "vllm"          # real vLLM processes, restarted per configuration
    endpoint = "endpoint"  # a server someone else runs


class CalibrationBackend(str, Enum):
    """What ``tuner calibrate`` measures: :class:`Backend` less ``endpoint`` (it restarts)."""

    vllm = "vllm"
    sim = "sim"


class Sampler(str, Enum):
    """Optuna's samplers (tuner.search.SAMPLERS)."""

    tpe = "tpe"
    gp = "gp"
    random = "random"
    grid = "grid"


class Output(str, Enum):
    """``--output`` everywhere: ``text`` for a person, ``json`` for a script."""

    text = "text"
    json = "json"


#: The flag of a library argument where it is not ``--`` and the argument with dashes.
FLAG_OF = {"timeout_s": "--timeout", "target_ttft_s": "--target-ttft", "slo": "--slo", "slos": "--slo"}


def as_flag(err: Exception) -> Exception:
    """A library error as the command line says it: an :class:`InputError` that names its
    argument (``budget must be >= 1``) names the flag instead (``--budget must be >= 1``)."""

    argument = getattr(err, "argument", None)
    if not isinstance(err, InputError) or not argument or argument.startswith("-"):
        return err  # not the library's, or already the flag's
    return err.for_flag(FLAG_OF.get(argument, "--" + argument.replace("_", "-")))


#: What --storage, --backend, --vllm-cmd and --trace mean wherever no more is said.
STORAGE_HELP = "Optuna storage (SQLAlchemy URL: postgresql://... to share with workers and notebooks). " \
               "Default: sqlite:///studies/<study>.db."
BACKEND_HELP = "sim: the embedded vLLM simulator (no GPU); vllm: restart real vLLM per configuration; " \
               "endpoint: a server someone else runs."
VLLM_CMD_HELP = "Command that starts vLLM (vllm backend), e.g. 'vllm serve' or 'python -m tuner sim-serve --speed 20'."
TRACE_HELP = "Request log to replay (any format tuner trace reads). Default: the built-in synthetic mix."


# The options several commands take, each declared once here (a command may say more of
# what it means there through ``help``).
def storage_option(help: str = STORAGE_HELP) -> Any:  # noqa: A002  (typer's name)
    """``--storage URL``: the Optuna storage of the study."""
    return typer.Option(None, "--storage", metavar="URL", help=help)


def backend_option(default: Enum | None = None, help: str = BACKEND_HELP) -> Any:  # noqa: A002
    """``--backend``: what a trial or a plan runs on (default ``sim``)."""
    return typer.Option(Backend.sim if default is None else default, "--backend", help=help)


def vllm_cmd_option(default: str | None = None, help: str = VLLM_CMD_HELP) -> Any:  # noqa: A002
    """``--vllm-cmd``: the command that starts vLLM, before the model."""
    return typer.Option(default, "--vllm-cmd", help=help)


def trace_option(help: str = TRACE_HELP) -> Any:  # noqa: A002
    """``--trace FILE``: a request log, checked to exist before anything runs."""
    return typer.Option(None, "--trace", callback=existing_file, help=help)


OUTPUT_HELP = "text: tables for a person; json: one JSON object on stdout, for scripts."
SKIP_BAD_HELP = "Skip malformed rows of --trace instead of stopping at the first (a note says how many and why)."


# The options that several commands take and that each command explains in its own words:
# each returns the typed alias a command declares its parameter with, the flag spelt here once
# and the default kept in the signature (``Gpus = gpus_option("...")``, then ``gpus: Gpus = None``).
def gpu_option(help: str) -> Any:  # noqa: A002
    """``--gpu NAME``: a GPU of tuner's catalog."""
    return Annotated[str, typer.Option("--gpu", help=help)]


def gpus_option(help: str) -> Any:  # noqa: A002
    """``--gpus``: a count (8) or device ids (0-7)."""
    return Annotated[str | None, typer.Option("--gpus", help=help)]


def model_option(help: str) -> Any:  # noqa: A002
    """``--model``: a preset or a folder holding config.json."""
    return Annotated[str, typer.Option("--model", help=help)]


def quantization_option(help: str) -> Any:  # noqa: A002
    """``-q/--quantization``: awq, gptq, fp8, ..."""
    return Annotated[str | None, typer.Option("--quantization", "-q", help=help)]


def dtype_option(help: str) -> Any:  # noqa: A002
    """``--dtype``: auto, float16/half, bfloat16."""
    return Annotated[str | None, typer.Option("--dtype", help=help)]


def vllm_version_option(help: str) -> Any:  # noqa: A002
    """``--vllm-version``: the vLLM release whose behaviour to follow."""
    return Annotated[str | None, typer.Option("--vllm-version", help=help)]


def tensor_parallel_size_option(help: str) -> Any:  # noqa: A002
    """``--tensor-parallel-size``: GPUs per replica (vLLM's own flag)."""
    return Annotated[int | None, typer.Option("--tensor-parallel-size", help=help)]


def replicas_option(help: str) -> Any:  # noqa: A002
    """``--replicas``: independent engines (data parallel)."""
    return Annotated[int | None, typer.Option("--replicas", help=help)]


def set_option(help: str) -> Any:  # noqa: A002
    """``--set KNOB=VALUE``, repeatable: a knob pinned at a value."""
    return Annotated[list[str] | None, typer.Option("--set", metavar="KNOB=VALUE", help=help)]


def skip_bad_option(help: str = SKIP_BAD_HELP) -> Any:  # noqa: A002
    """``--skip-bad``: skip a request log's malformed rows."""
    return Annotated[bool, typer.Option("--skip-bad", help=help)]


def num_requests_option(help: str) -> Any:  # noqa: A002
    """``-n/--num-requests``: requests per run."""
    return Annotated[int | None, typer.Option("--num-requests", "-n", help=help)]


def concurrency_option(help: str) -> Any:  # noqa: A002
    """``-c/--concurrency``: closed-loop users, comma-separated."""
    return Annotated[str | None, typer.Option("--concurrency", "-c", help=help)]


def rate_option(help: str) -> Any:  # noqa: A002
    """``--rate``: open-loop Poisson rates in req/s, comma-separated."""
    return Annotated[str | None, typer.Option("--rate", help=help)]


def seed_option(help: str) -> Any:  # noqa: A002
    """``--seed``: the seed of what the command draws."""
    return Annotated[int, typer.Option("--seed", help=help)]


def output_option(help: str = OUTPUT_HELP) -> Any:  # noqa: A002
    """``-o/--output``: text for a person, json for a script."""
    return Annotated[Output, typer.Option("--output", "-o", help=help)]


def out_option(help: str, metavar: str = "DIR") -> Any:  # noqa: A002
    """``--out``: where a command writes its files (a folder; export's, a file)."""
    return Annotated[str | None, typer.Option("--out", metavar=metavar, help=help)]


def timeout_option(help: str) -> Any:  # noqa: A002
    """``--timeout``: how long to go on starting trials (2h, 45m, 3600)."""
    return Annotated[str | None, typer.Option("--timeout", help=help)]


def target_ttft_option(help: str) -> Any:  # noqa: A002
    """``--target-ttft``: the P95 time-to-first-token target (5s, 500ms, 5)."""
    return Annotated[str | None, typer.Option("--target-ttft", help=help)]


def slo_option(help: str) -> Any:  # noqa: A002
    """``--slo``, repeatable: a service level (p99:tpot<=30ms)."""
    return Annotated[list[str] | None, typer.Option("--slo", help=help)]


def study_option(help: str) -> Any:  # noqa: A002
    """``--study``: a study's name."""
    return Annotated[str | None, typer.Option("--study", help=help)]


def endpoint_option(help: str) -> Any:  # noqa: A002
    """``--endpoint``: base URL(s) of a running server, comma-separated."""
    return Annotated[str | None, typer.Option("--endpoint", help=help)]


def api_key_file_option(help: str) -> Any:  # noqa: A002
    """``--api-key-file``: a file holding the endpoint's API key."""
    return Annotated[str | None, typer.Option("--api-key-file", help=help)]


#: One spelling per concept, in every command: the spellings commands used before, each
#: with the one that replaced it. The old ones still work, hidden from --help
#: (:func:`old_spelling`), and print a one-line note; tests/cli/test_flags.py checks that no
#: command shows one.
RENAMED = {
    "--rates": "--rate",            # open-loop Poisson rates, req/s (plan; estimate said --rate)
    "--report-dir": "--out",        # where a command writes its files (nightly; the others said --out)
    "--wall-clock": "--timeout",    # stop starting trials after this long (nightly; search said --timeout)
    "--budget-s": "--timeout",      # the same for calibrate's trials
    "--tp": "--tensor-parallel-size",  # GPUs per replica (estimate, plan): vLLM's own flag, as search says it
}


def old_spelling(old: str) -> Any:
    """A hidden option for ``old``, kept for scripts written before :data:`RENAMED`."""
    return typer.Option(None, old, hidden=True, help=f"Old spelling of {RENAMED[old]}.")


def renamed(value: Any, old_value: Any, old: str) -> Any:
    """``value`` of the new spelling, or what ``old`` gave (with a one-line note on stderr)."""
    if old_value is None:
        return value
    new = RENAMED[old]
    print(f"tuner: note: {old} is now spelled {new} (the old spelling still works)", file=sys.stderr)
    if value is not None and value != old_value:
        raise InputError(f"{old} and {new} are the same option, given two values", hint=f"give {new} once")
    return old_value


def existing_file(value: str | None) -> str | None:
    """An option's callback: the file it names exists, else click's one line names the flag,
    the file, and where a relative path was looked for (the working directory: a path typed on
    the command line is never read from a search space's folder)."""
    if value is None:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        why = "a folder, not a file" if path.is_dir() else "no such file"
        where = "" if path.is_absolute() else f" in {Path.cwd()}"
        raise typer.BadParameter(f"{value}: {why}{where}")
    return value


__all__ = ["OUTPUT_HELP", "existing_file", "RENAMED", "Backend", "CalibrationBackend", "Output", "Sampler", "old_spelling", "renamed"]  # noqa: E501

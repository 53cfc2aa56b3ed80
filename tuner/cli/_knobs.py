"""The vLLM knobs every command takes, read from :data:`tuner.core.knobs.KNOBS`: :data:`KNOB_FLAGS` has
each knob's ``vllm serve`` flag and help, :func:`knob_option` makes the typer option of one (``None``
when not given: the command resolves its own default) and :func:`with_knob_options` one of each
for a command, and :func:`pins` turns the flags
given and the repeatable ``--set knob=value`` into one ``{knob: value}``, checked against
the knob's type and range (:func:`tuner.space.pin_value`). ``tuner search`` pins those knobs
(they are not searched); ``tuner estimate`` and ``tuner plan`` run the configuration they
describe (:func:`build_deployment_config`)."""
from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional

import typer

from tuner.core.errors import InputError
from tuner.core.knobs import KNOBS, knob
from tuner.serving.config import Deployment, ServeConfig
from tuner.space import pin_layout_value, pin_value

#: Knob (a :class:`ServeConfig` field, a row of :data:`tuner.core.knobs.KNOBS`) → its ``vllm serve``
#: flag (booleans take ``--no-<flag>`` too) and what it does.
KNOB_FLAGS: dict[str, tuple[str, str]] = {k.name: (k.flag, k.help) for k in KNOBS}

#: The layout's halves that ``tuner search`` pins like a knob, by their ``vllm serve`` flag.
LAYOUT_FLAGS = {"tensor_parallel_size": "tensor-parallel-size", "replicas": "replicas"}

SET_HELP = ("Pin a knob at a value, repeatable; the knob by its name or vLLM flag: --set max_num_seqs=256 "
            "--set enforce-eager=true. Same as the knob's own flag.")


def knob_option(name: str, more: str = "") -> Any:
    """The typer option of knob ``name`` (``--max-num-seqs``; ``--enforce-eager/--no-enforce-eager``
    for a boolean), ``None`` when not given; ``more`` is added to its help."""
    flag, text = KNOB_FLAGS[name]
    decl = f"--{flag}/--no-{flag}" if knob(name).type is bool else f"--{flag}"
    return typer.Option(None, decl, help=f"{text}{more}")


def with_knob_options(more: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A typer command with one option per row of :data:`tuner.core.knobs.KNOBS` (:func:`knob_option`,
    ``more`` added to each help), placed before its ``set_`` parameter; the command receives them
    as one ``knob_flags`` mapping (knob -> value, None when not given), as :func:`pins` takes it.
    A knob added to the table is an option of every command so made."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        params = [p for p in signature.parameters.values() if p.name != "knob_flags"]
        at = next(i for i, p in enumerate(params) if p.name == "set_")
        options = [inspect.Parameter(k.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                     default=knob_option(k.name, more), annotation=Optional[k.type])
                   for k in KNOBS]

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            knob_flags = {k.name: given.pop(k.name) for k in KNOBS}
            return command(**given, knob_flags=knob_flags)

        run.__signature__ = signature.replace(parameters=params[:at] + options + params[at:])  # type: ignore[attr-defined]
        return run

    return decorate


def _knob_named(text: str, said: str, flags: Mapping[str, str]) -> str:
    key = text.strip().removeprefix("--")
    name = {flag: name for name, flag in flags.items()}.get(key, key.replace("-", "_"))
    if name not in flags:
        raise InputError(f"{said}: {text.strip()!r} is not a knob", hint=f"knobs: {', '.join(flags)}")
    return name


def pins(flags: Mapping[str, Any], sets: Iterable[str] | None = None,
         layout: Mapping[str, int | None] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``{knob: value}`` from the knob flags given (``flags``: knob → value or None) and the
    ``--set knob=value`` texts, each value checked; and, per knob, what the user wrote (for
    messages). A knob given twice with two values is refused. With ``layout`` (``tuner
    search``: ``--tensor-parallel-size``, ``--replicas``, by :data:`LAYOUT_FLAGS` name → value
    or None), those are pins too, and ``--set`` takes them."""

    known = {name: flag for name, (flag, _) in KNOB_FLAGS.items()}
    if layout is not None:
        known.update(LAYOUT_FLAGS)
    checked = lambda name, value, said: (pin_layout_value if name in LAYOUT_FLAGS else pin_value)(name, value, said)  # noqa: E731
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for name, value in {**flags, **(layout or {})}.items():
        if value is not None:
            where[name] = f"--{known[name]}"
            values[name] = checked(name, value, where[name])
    for text in sets or ():
        said = f"--set {text}"
        if "=" not in text:
            raise InputError(f"{said}: write knob=value", hint="e.g. --set max_num_seqs=256")
        key, raw = text.split("=", 1)
        name = _knob_named(key, said, known)
        value = checked(name, raw, said)
        if name in values and values[name] != value:
            raise InputError(f"{said}: {name} is already pinned at {values[name]} by {where[name]}",
                             hint="give each knob once")
        values[name], where[name] = value, said
    return values, where


def parse_gpus(text: str) -> tuple[int, tuple[int, ...]]:
    """``"8"`` → 8 GPUs; ``"0-3"``, ``"0,2,5"`` or ``"0-1,4"`` → those device ids."""
    s = text.strip()
    if re.fullmatch(r"\d+", s):
        n = int(s)
        if n < 1:
            raise InputError(f"--gpus must be >= 1, got {text!r}")
        return n, ()
    ids: list[int] = []
    for part in s.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise InputError(f"cannot read --gpus {text!r}", hint="write a count (8) or device ids (0-7, 0,2,4)")
        ids += range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1)
    if len(set(ids)) != len(ids):
        raise InputError(f"--gpus {text!r} names a device twice")
    return len(ids), tuple(ids)


def quantization_flag(text: str | None) -> str | None:
    """``--quantization``: ``none`` (any case), like a flag not given, is no quantization."""
    return None if text is None or text.lower() == "none" else text


def build_deployment_config(
    *, model: str, gpu: str, gpus: str | None, vllm_version: str, dtype: str, quantization: str | None,
    tp: int, replicas: int, knobs: Mapping[str, Any],
) -> tuple[Deployment, ServeConfig]:
    """The machine (``--gpu``, ``--gpus``, ``--model``, ...) and the ``vllm serve`` flags
    (``--tensor-parallel-size``, ``--max-num-seqs``, ...; ``knobs``: those given, by knob name, as :func:`pins`
    returns them) as the two objects the simulator and backends take; a knob not given is
    ServeConfig's default (``None``: vLLM's default for the version, GPU and model). ``gpus`` is
    ``--gpus`` as given (a count or device ids; not given: tp x replicas, what the layout needs)."""
    gpu_count, gpu_ids = parse_gpus(gpus) if gpus else (tp * replicas, ())
    deployment = Deployment(
        model=model, gpu=gpu, gpu_count=gpu_count, gpu_ids=gpu_ids, vllm_version=vllm_version,
        dtype=dtype, quantization=quantization_flag(quantization),
    )
    return deployment, ServeConfig(**knobs, tensor_parallel_size=tp, replicas=replicas)

"""The ``parameters`` and ``layouts`` sections of a space file: each knob fixed, a range or
choices, typed and checked as ServeConfig checks it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.core.values import shown
from tuner.serving.config import ServeConfig
from tuner.space.checks import check_keys
from tuner.space.knob_values import DEFAULT_NONE, KNOB_TYPES, as_float, knob_problem, numeric, own_message, whole
from tuner.space.param import Param, choice_param, parse_layout

if TYPE_CHECKING:
    from tuner.space.search_space import SearchSpace

#: Choices of one knob: a sampler learns nothing over more; write a range.
MAX_CHOICES = 1024


def parse_parameters(space: SearchSpace, data: Any) -> tuple[tuple[Param, ...], tuple[tuple[str, Any], ...]]:
    check_keys(space, data, KNOB_TYPES, ("parameters",))
    params: list[Param] = []
    fixed: list[tuple[str, Any]] = []
    for name, spec in data.items():
        where = ("parameters", name)
        typ = KNOB_TYPES[name]
        if isinstance(spec, dict):
            check_keys(space, spec, ("low", "high", "step", "log", "choices"), where)
            if "choices" in spec:
                choices_in = spec["choices"]
                if set(spec) - {"choices"} or not isinstance(choices_in, list) or not choices_in:
                    raise space.error(
                        "choices must be a non-empty list, alone", where, hint="e.g. {choices: [16, 32]}"
                    )
                if len(choices_in) > MAX_CHOICES:
                    raise space.error(f"{len(choices_in):,} choices are more than {MAX_CHOICES}", where,
                                      hint="write a range: {low: ..., high: ..., log: true}")
                choices = tuple(_typed(space, name, v, where + ("choices", i)) for i, v in enumerate(choices_in))
                if len(set(choices)) != len(choices):
                    raise space.error("choices repeat a value", where, hint="list each value once")
                params.append(choice_param(name, choices))
                continue
            if typ not in (int, float):
                raise space.error(f"{name} takes choices, not a range", where, hint="write {choices: [...]}")
            if "low" not in spec or "high" not in spec:
                raise space.error("a range needs low and high", where, hint="e.g. {low: 16, high: 512}")
            low, high = (_typed(space, name, spec[k], where + (k,)) for k in ("low", "high"))
            step = None if spec.get("step") is None else _typed(space, name, spec["step"], where + ("step",))
            log = spec.get("log", False)
            if not isinstance(log, bool):
                raise space.error(f"log must be true or false, got {shown(log)}", where + ("log",))
            if not low < high:
                raise space.error(f"low ({low}) must be below high ({high})", where, hint="swap them or fix a value")
            if log and step is not None:
                raise space.error("log scale and step cannot be combined", where, hint="drop one of them")
            if log and low <= 0:
                raise space.error("log scale needs low > 0", where)
            if step is not None and step <= 0:
                raise space.error(f"step must be > 0, got {step}", where + ("step",))
            params.append(Param(name, "int" if typ is int else "float", low=low, high=high, step=step, log=log))
        elif isinstance(spec, list):
            raise space.error("a list of values must be written as choices", where,
                              hint=f"write {name}: {{choices: {shown(spec)}}}")
        elif spec is None:
            if name not in DEFAULT_NONE:
                raise space.error(f"{name} cannot be null", where, hint="leave the key out for vLLM's default")
            fixed.append((name, None))
        else:
            fixed.append((name, _typed(space, name, spec, where)))
    return tuple(params), tuple(fixed)


def _typed(space: SearchSpace, name: str, value: Any, where: tuple[Any, ...]) -> Any:
    """``value`` checked against knob ``name``'s type and ServeConfig's own validation."""
    typ = KNOB_TYPES[name]
    if typ in (int, float):
        value = numeric(value)
        value = whole(value) if typ is int else value
    problem = knob_problem(name, value)
    if problem is not None:
        raise space.error(problem[0], where, hint=problem[1])
    value = as_float(value) if typ is float else typ(value)
    if typ in (int, float):
        try:
            ServeConfig(**{name: value})
        except InputError as err:
            raise space.error(own_message(err.message, name), where, hint=err.hint) from err
    return value


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def parse_layouts(space: SearchSpace, data: Any) -> tuple[tuple[int, int], ...] | None:
    if data is None or data == "auto":
        return None
    if not isinstance(data, list) or not data:
        raise space.error(
            f"layouts must be 'auto' or a list, got {shown(data)}", ("layouts",),
            hint="e.g. layouts: [tp1x8, tp2x4, tp4x2]",
        )
    out = []
    for i, item in enumerate(data):
        try:
            out.append(parse_layout(item))
        except InputError as err:
            raise space.error(err.message, ("layouts", i), hint=err.hint) from err
    return tuple(dict.fromkeys(out))



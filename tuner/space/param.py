"""One searched knob (:class:`Param`) and layouts (``tp2x4``: tensor-parallel size x replicas)."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.core.values import shown
from tuner.serving.config import MAX_GPUS

if TYPE_CHECKING:
    import optuna

_LAYOUT_RE = re.compile(r"^tp(\d+)x(\d+)$")
#: What :meth:`Param.read` gives for a trial that does not hold the knob.
MISSING = object()


def index_key(name: str) -> str:
    """Where studies written before kept ordered choices: their index, ``<knob>_index``."""
    return f"{name}_index"


def even_step(choices: Sequence[Any]) -> int | None:
    """The step of whole numbers evenly spaced (``(16, 32, 48)`` → 16), else ``None``."""
    if len(choices) < 2 or not all(type(c) is int for c in choices):
        return None
    steps = {b - a for a, b in zip(choices, choices[1:])}
    return steps.pop() if len(steps) == 1 else None


def parse_layout(text: str) -> tuple[int, int]:
    """``"tp2x4"`` → ``(2, 4)``: tensor-parallel size 2, 4 replicas."""
    m = _LAYOUT_RE.match(str(text).strip().lower()) if isinstance(text, str) else None
    if not m or m.group(1).strip("0") == "" or m.group(2).strip("0") == "":
        raise InputError(f"cannot read layout {shown(text)}", hint="write tp<TP>x<replicas>, e.g. tp2x4")
    if max(len(m.group(1)), len(m.group(2))) > 6 or max(int(m.group(1)), int(m.group(2))) > MAX_GPUS:
        raise InputError(f"layout {shown(text)} uses more GPUs than tuner plans for (1-{MAX_GPUS})")
    return int(m.group(1)), int(m.group(2))


def layout_name(tp: int, replicas: int) -> str:
    return f"tp{tp}x{replicas}"


#: The two halves of a layout that a search can pin like a knob (``--tensor-parallel-size 2``,
#: ``--set replicas=4``): it then keeps only the space's layouts with that value.
LAYOUT_PINS = ("tensor_parallel_size", "replicas")


def pin_layout_value(name: str, value: Any, said: str) -> int:
    """``value`` (an int, or text from ``--set``) of :data:`LAYOUT_PINS` ``name`` as a whole
    number of GPUs or replicas, 1 to ``MAX_GPUS``; InputError naming ``said`` otherwise."""
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"\d{1,6}", text) or not 1 <= int(text) <= MAX_GPUS:
        raise InputError(f"{said}: {name} takes a whole number from 1 to {MAX_GPUS}, got {shown(value)}",
                         hint=f"e.g. --set {name}=2")
    return int(text)


@dataclass(frozen=True, slots=True)
class Param:
    """One searched knob: a range (``low``/``high``, optional ``step``, ``log``) or ``choices``."""

    name: str
    kind: str  # "int" | "float" | "categorical" | "ordinal"
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    #: Ordered choices stored as their index, ``<knob>_index`` (studies written before the
    #: knobs were stored under their own names; :meth:`SearchSpace.encoded_for` keeps it for them).
    indexed: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("int", "float", "categorical", "ordinal"):
            raise InputError(f"parameter {self.name}: unknown kind {self.kind!r}")
        if self.indexed and self.kind != "ordinal":
            raise InputError(f"parameter {self.name}: only ordered choices are stored as an index")
        if self.kind in ("categorical", "ordinal"):
            if not self.choices:
                raise InputError(f"parameter {self.name}: empty choices")
            if self.kind == "ordinal" and list(self.choices) != sorted(set(self.choices)):
                raise InputError(f"parameter {self.name}: ordinal choices must be distinct and ascending")
            return
        if self.low is None or self.high is None or not self.low <= self.high:
            raise InputError(f"parameter {self.name}: need low <= high, got {self.low}..{self.high}")
        if self.log and (self.step is not None or self.low <= 0):
            raise InputError(f"parameter {self.name}: log scale needs low > 0 and no step")

    @property
    def key(self) -> str:
        """The name Optuna stores: the knob's own (``<knob>_index`` in an indexed study)."""
        return index_key(self.name) if self.indexed else self.name

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """The Optuna distribution of :attr:`key`. Ordered choices keep their real values:
        whole numbers evenly spaced (16, 32, 48) as an integer range on that step, which the
        sampler models as numbers; other ladders (32, 64, 128) as choices of the values."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.indexed:
            return IntDistribution(0, len(self.choices) - 1)
        if self.kind == "ordinal" and (step := even_step(self.choices)) is not None:
            return IntDistribution(self.choices[0], self.choices[-1], step=step)
        if self.kind in ("categorical", "ordinal"):
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return FloatDistribution(self.low, self.high, step=self.step, log=self.log)

    def encode(self, value: Any) -> Any:
        """Knob value → the trial parameter's value (ordered choices snapped to the nearest;
        its index in an indexed study)."""
        if self.kind != "ordinal":
            return value
        value = self.nearest(value)
        return self.choices.index(value) if self.indexed else value

    def decode(self, value: Any) -> Any:
        """Trial parameter value → knob value."""
        return self.choices[int(value)] if self.indexed else value

    def read(self, params: Mapping[str, Any]) -> Any:
        """This knob's value in a trial's ``params``: under :attr:`key`, or for ordered choices
        under the other encoding (``<knob>_index`` of a study written before, or the real
        value); :data:`MISSING` when the trial has neither."""
        if self.key in params:
            return self.decode(params[self.key])
        if self.kind == "ordinal":
            other = replace(self, indexed=not self.indexed)
            if other.key in params:
                return other.decode(params[other.key])
        return MISSING

    def suggest(self, trial: optuna.Trial) -> Any:
        from optuna.distributions import CategoricalDistribution, IntDistribution

        d = self.distribution()
        if isinstance(d, IntDistribution):
            return self.decode(trial.suggest_int(self.key, d.low, d.high, step=d.step, log=d.log))
        if isinstance(d, CategoricalDistribution):
            return trial.suggest_categorical(self.key, list(d.choices))
        return trial.suggest_float(self.key, d.low, d.high, step=d.step, log=d.log)

    def grid_values(self, points: int = 4) -> tuple[Any, ...]:
        """A discretised version: the choices, the steps (when few), or ``points`` values
        spread evenly (geometrically for log scale) between low and high."""
        if self.kind in ("categorical", "ordinal"):
            return self.choices
        lo, hi = float(self.low), float(self.high)
        if self.step is not None and (hi - lo) / self.step + 1 <= points:
            values = [lo + i * self.step for i in range(int(round((hi - lo) / self.step)) + 1)]
        elif self.log:
            values = list(lo * (hi / lo) ** (i / max(points - 1, 1)) for i in range(points))
        else:
            values = list(lo + (hi - lo) * i / max(points - 1, 1) for i in range(points))
        if self.kind == "int":
            step = int(self.step or 1)
            values = [int(lo + round((v - lo) / step) * step) for v in values]
        else:
            values = [round(v, 4) for v in values]
        return tuple(dict.fromkeys(values))

    def nearest(self, value: Any) -> Any:
        """The value of this parameter closest to ``value`` (a choice, or a point of the
        range on its step); the first choice when nothing compares."""
        if self.kind in ("categorical", "ordinal"):
            if value in self.choices:
                return value
            numeric = [c for c in self.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
            if numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
                return min(numeric, key=lambda c: (abs(c - value), c))
            return self.choices[0]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            value = (self.low + self.high) / 2
        value = min(max(value, self.low), self.high)
        if self.step:
            value = self.low + round((value - self.low) / self.step) * self.step
        return int(round(value)) if self.kind == "int" else round(float(value), 6)

    def contains(self, value: Any) -> bool:
        if self.kind in ("categorical", "ordinal"):
            return value in self.choices
        return value is not None and self.low <= value <= self.high


def choice_param(name: str, choices: Sequence[Any]) -> Param:
    """A parameter over ``choices``: ordered (:meth:`Param.distribution`) when they are three
    or more numbers, else categorical."""
    numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices)
    if numeric and len(choices) >= 3:
        return Param(name, "ordinal", choices=tuple(sorted(choices)))
    return Param(name, "categorical", choices=tuple(choices))

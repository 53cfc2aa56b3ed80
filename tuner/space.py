"""Search spaces: which vLLM knobs a study varies, over which ranges, on which
deployment, against which workload and TTFT target. Read from YAML
(``search_spaces/*.yaml``); see ``search_spaces/default.yaml`` for every key.

A knob is either a fixed value (``block_size: 16``), a range
(``{low: 16, high: 512, log: true}``, ``step`` optional) or a list of choices
(``{choices: [auto, fp8]}``). Layouts (tensor-parallel size x replicas) are one
categorical parameter named ``layout`` with values such as ``tp2x4`` so that the
sampler sees a fixed distribution; ``layouts: auto`` takes every power-of-two TP that
divides the attention heads, with as many replicas as the GPUs hold.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner.config import KV_CACHE_DTYPES, Deployment, ServeConfig
from tuner.errors import InputError

if TYPE_CHECKING:
    import optuna

#: Knobs a space may vary, with their Python type.
KNOBS: dict[str, type] = {
    "gpu_memory_utilization": float,
    "max_num_seqs": int,
    "max_model_len": int,
    "block_size": int,
    "max_num_batched_tokens": int,
    "enable_prefix_caching": bool,
    "enforce_eager": bool,
    "kv_cache_dtype": str,
}
LOAD_KINDS = ("concurrency", "rate", "trace")
_TOP_KEYS = ("name", "description", "deployment", "workload", "parameters", "layouts")
_DEPLOYMENT_KEYS = {f.name for f in fields(Deployment)} | {"gpus"}
_WORKLOAD_KEYS = ("target_ttft_s", "trace", "requests", "rate", "load", "seed")
_LAYOUT_RE = re.compile(r"^tp(\d+)x(\d+)$")

#: Folder of the spaces shipped with the repository.
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "search_spaces"


def parse_seconds(value: str | float | int, *, what: str = "time") -> float:
    """``"5s"``, ``"500ms"``, ``"2m"``, ``"24h"``, ``"1d"`` or a bare number of seconds → seconds (> 0)."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be a duration such as 5s or 500ms, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?\d+)?)\s*(ms|s|sec|m|min|h|d)?\s*", str(value).lower())
        if not m:
            raise InputError(
                f"cannot read {what} {value!r}", hint="write a duration such as 5s, 500ms or 5"
            )
        units = {"ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
        seconds = float(m.group(1)) * units.get(m.group(2) or "s", 1.0)
    if not seconds > 0 or not math.isfinite(seconds):
        raise InputError(f"{what} must be > 0, got {value!r}")
    return seconds


def parse_layout(text: str) -> tuple[int, int]:
    """``"tp2x4"`` → ``(2, 4)``: tensor-parallel size 2, 4 replicas."""
    m = _LAYOUT_RE.match(str(text).strip().lower())
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise InputError(f"cannot read layout {text!r}", hint="write tp<TP>x<replicas>, e.g. tp2x4")
    return int(m.group(1)), int(m.group(2))


def layout_name(tp: int, replicas: int) -> str:
    return f"tp{tp}x{replicas}"


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

    def __post_init__(self) -> None:
        if self.kind not in ("int", "float", "categorical", "ordinal"):
            raise InputError(f"parameter {self.name}: unknown kind {self.kind!r}")
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
        """The name Optuna stores: the knob, or ``<knob>_index`` for ordered choices."""
        return f"{self.name}_index" if self.kind == "ordinal" else self.name

    def encode(self, value: Any) -> Any:
        """Knob value → the trial parameter's value (an index for ordered choices)."""
        return self.choices.index(self.nearest(value)) if self.kind == "ordinal" else value

    def decode(self, value: Any) -> Any:
        """Trial parameter value → knob value."""
        return self.choices[int(value)] if self.kind == "ordinal" else value

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.kind == "ordinal":  # an int index: the sampler sees that 64 lies between 32 and 128
            return self.choices[trial.suggest_int(self.key, 0, len(self.choices) - 1)]
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log
            )
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

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
    """A parameter over ``choices``: ordered (an index the sampler can interpolate) when
    they are three or more numbers, else categorical."""
    numeric = all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices)
    if numeric and len(choices) >= 3:
        return Param(name, "ordinal", choices=tuple(sorted(choices)))
    return Param(name, "categorical", choices=tuple(choices))


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The traffic a study optimises for and the TTFT target it must meet.

    ``trace`` is a log file (any format ``tuner.traffic`` reads); ``None`` takes the
    built-in synthetic mix (``requests`` requests at ``rate`` req/s, seeded).
    ``load`` is how the goodput search offers it: ``concurrency`` (closed loop,
    N users), ``rate`` (Poisson at a rate) or ``trace`` (logged times, compressed).
    """

    target_ttft_s: float = 2.0
    trace: str | None = None
    requests: int = 200
    rate: float = 10.0
    load: str = "concurrency"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.target_ttft_s > 0:
            raise InputError(f"target_ttft_s must be > 0, got {self.target_ttft_s}")
        if self.load not in LOAD_KINDS:
            raise InputError(f"load {self.load!r} is not one of {', '.join(LOAD_KINDS)}")
        if self.requests < 1 or not self.rate > 0:
            raise InputError(f"requests must be >= 1 and rate > 0, got {self.requests}, {self.rate}")


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """A parsed search space. ``layouts`` is ``None`` for ``auto`` until :meth:`bind`."""

    name: str
    deployment: Deployment
    workload: WorkloadSpec
    params: tuple[Param, ...] = ()
    fixed: tuple[tuple[str, Any], ...] = ()
    layouts: tuple[tuple[int, int], ...] | None = None
    description: str = ""
    path: str = "<space>"
    lines: dict[tuple[Any, ...], int] = field(default_factory=dict, compare=False, repr=False)

    # -- binding to a deployment ------------------------------------------------------
    def bind(self, deployment: Deployment, num_heads: int) -> SearchSpace:
        """The space for ``deployment`` (whose model has ``num_heads`` attention heads):
        ``auto`` layouts resolved, explicit ones checked (tp x replicas <= GPUs, TP
        divides the heads)."""
        gpus = deployment.gpu_count
        if self.layouts is None:
            tps = [tp for tp in (1, 2, 4, 8, 16, 32, 64) if tp <= gpus and num_heads % tp == 0]
            layouts = tuple((tp, gpus // tp) for tp in tps)
        else:
            layouts = self.layouts
            for tp, replicas in layouts:
                name = layout_name(tp, replicas)
                if tp * replicas > gpus:
                    raise self.error(
                        f"layout {name} needs {tp * replicas} GPUs, the deployment has {gpus}",
                        ("layouts",), hint=f"keep tp x replicas <= {gpus}, or pass --gpus",
                    )
                if num_heads % tp:
                    raise self.error(
                        f"layout {name}: tensor-parallel size {tp} does not divide the "
                        f"{num_heads} attention heads of {deployment.model}",
                        ("layouts",), hint="use a TP that divides the heads, or layouts: auto",
                    )
        return _replace(self, deployment=deployment, layouts=layouts)

    # -- sampling ---------------------------------------------------------------------
    @property
    def layout_choices(self) -> tuple[str, ...]:
        return tuple(layout_name(tp, r) for tp, r in (self.layouts or ((1, self.deployment.gpu_count),)))

    def suggest(self, trial: optuna.Trial) -> ServeConfig:
        """Ask ``trial`` for every searched knob and build the :class:`ServeConfig`."""
        values = dict(self.fixed)
        for p in self.params:
            values[p.name] = p.suggest(trial)
        return self._config(values, self._layout(trial))

    def _layout(self, trial: optuna.Trial) -> str:
        choices = self.layout_choices
        return choices[0] if len(choices) == 1 else trial.suggest_categorical("layout", list(choices))

    def _config(self, values: dict[str, Any], layout: str) -> ServeConfig:
        # float steps come back from Optuna as 0.9099999999999999: keep the flag readable
        values = {k: round(v, 6) if isinstance(v, float) else v for k, v in values.items()}
        tp, replicas = parse_layout(layout)
        return ServeConfig(**values, tensor_parallel_size=tp, replicas=replicas)

    def config_from_params(self, params: dict[str, Any]) -> ServeConfig:
        """The :class:`ServeConfig` of a trial's ``params`` (as Optuna stores them)."""
        values = dict(self.fixed)
        values.update({p.name: p.decode(params[p.key]) for p in self.params if p.key in params})
        return self._config(values, params.get("layout", self.layout_choices[0]))

    def params_of(self, config: ServeConfig) -> dict[str, Any]:
        """Trial params for ``config`` (for ``study.enqueue_trial``)."""
        params = {p.key: p.encode(getattr(config, p.name)) for p in self.params}
        if len(self.layout_choices) > 1:
            params["layout"] = layout_name(config.tensor_parallel_size, config.replicas)
        return params

    def grid(self, points: int = 4) -> dict[str, list[Any]]:
        """A discretised version of the space for ``GridSampler`` (``points`` per range)."""
        grid = {p.key: [p.encode(v) for v in p.grid_values(points)] for p in self.params}
        if len(self.layout_choices) > 1:
            grid["layout"] = list(self.layout_choices)
        return grid

    def discretised(self, points: int = 4) -> SearchSpace:
        """The same space with every range replaced by its grid values as choices."""
        params = tuple(choice_param(p.name, p.grid_values(points)) for p in self.params)
        return _replace(self, params=params)

    def with_workload(self, **changes: Any) -> SearchSpace:
        return _replace(self, workload=_replace(self.workload, **changes))

    def error(self, message: str, key: tuple[Any, ...], *, hint: str | None = None) -> InputError:
        """An :class:`InputError` pointing at ``key`` (a path of YAML keys) in the file."""
        line = None
        for n in range(len(key), 0, -1):
            line = self.lines.get(tuple(key[:n]))
            if line is not None:
                break
        dotted = ".".join(str(k) for k in key)
        return InputError(f"{dotted}: {message}", path=self.path, line=line, hint=hint)


def _replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


# -- loading ---------------------------------------------------------------------------
def list_spaces() -> list[Path]:
    """The shipped spaces (``search_spaces/*.yaml``)."""
    return sorted(SHIPPED_DIR.glob("*.yaml"))


def resolve_space_path(name_or_path: str | Path) -> Path:
    """A path as given, else a shipped space by name (``default``, ``article-004-8xv100-32gb``)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    for folder in (Path.cwd() / "search_spaces", SHIPPED_DIR):
        for candidate in (folder / f"{name_or_path}.yaml", folder / str(name_or_path)):
            if candidate.is_file():
                return candidate
    known = ", ".join(p.stem for p in list_spaces()) or "none"
    raise InputError(
        f"no search space {str(name_or_path)!r}",
        hint=f"give a YAML file or a shipped space name: {known}",
    )


def load_space(name_or_path: str | Path = "default") -> SearchSpace:
    """Read and validate a search space (a shipped name or a YAML path)."""
    path = resolve_space_path(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"cannot read search space: {err.strerror}", path=path) from err
    return parse_space(text, path=str(path))


def parse_space(text: str, *, path: str = "<space>") -> SearchSpace:
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise InputError(
            f"not valid YAML: {getattr(err, 'problem', None) or err}",
            path=path, line=None if mark is None else mark.line + 1,
            hint="check indentation and colons",
        ) from err
    lines = _line_index(node)
    default_name = Path(path).stem if path != "<space>" else "space"
    stub = SearchSpace(default_name, Deployment(), WorkloadSpec(), path=path, lines=lines)
    if not isinstance(data, dict):
        raise stub.error("a search space is a mapping of keys", (), hint="see search_spaces/default.yaml")
    _check_keys(stub, data, _TOP_KEYS, ())
    deployment = _parse_deployment(stub, data.get("deployment") or {})
    workload = _parse_workload(stub, data.get("workload") or {})
    params, fixed = _parse_parameters(stub, data.get("parameters") or {})
    layouts = _parse_layouts(stub, data.get("layouts", "auto"))
    return SearchSpace(
        name=str(data.get("name") or default_name),
        deployment=deployment,
        workload=workload,
        params=params,
        fixed=fixed,
        layouts=layouts,
        description=str(data.get("description") or ""),
        path=path,
        lines=lines,
    )


def _line_index(node: yaml.Node | None) -> dict[tuple[Any, ...], int]:
    """Key path → 1-based line of that key in the YAML text."""
    out: dict[tuple[Any, ...], int] = {}

    def walk(n: yaml.Node, path: tuple[Any, ...]) -> None:
        out.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                out[path + (k.value,)] = k.start_mark.line + 1
                walk(v, path + (k.value,))
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                walk(v, path + (i,))

    if node is not None:
        walk(node, ())
    return out


def _check_keys(space: SearchSpace, data: Any, known: Any, where: tuple[Any, ...]) -> None:
    if not isinstance(data, dict):
        raise space.error(f"expected a mapping, got {type(data).__name__}", where)
    for key in data:
        if key not in known:
            raise space.error(
                f"unknown key {key!r}", where + (key,), hint=f"known keys: {', '.join(sorted(known))}"
            )


def _parse_deployment(space: SearchSpace, data: Any) -> Deployment:
    _check_keys(space, data, _DEPLOYMENT_KEYS, ("deployment",))
    values = dict(data)
    if "gpus" in values:
        values["gpu_count"] = values.pop("gpus")
    if "gpu_ids" in values:
        values["gpu_ids"] = tuple(values["gpu_ids"] or ())
    try:
        return Deployment(**values)
    except (InputError, TypeError) as err:
        raise space.error(str(getattr(err, "message", err)), ("deployment",)) from err


def _parse_workload(space: SearchSpace, data: Any) -> WorkloadSpec:
    _check_keys(space, data, _WORKLOAD_KEYS, ("workload",))
    values = dict(data)
    key = ("workload", "target_ttft_s")
    try:
        if "target_ttft_s" in values:
            values["target_ttft_s"] = parse_seconds(values["target_ttft_s"], what="target_ttft_s")
        for name, typ in (("requests", int), ("rate", float), ("seed", int)):
            if name in values:
                key = ("workload", name)
                if isinstance(values[name], bool) or not isinstance(values[name], (int, float)):
                    raise InputError(f"must be a number, got {values[name]!r}")
                values[name] = typ(values[name])
        key = ("workload",)
        return WorkloadSpec(**values)
    except InputError as err:
        raise space.error(err.message, key, hint=err.hint) from err


def _parse_parameters(space: SearchSpace, data: Any) -> tuple[tuple[Param, ...], tuple[tuple[str, Any], ...]]:
    _check_keys(space, data, KNOBS, ("parameters",))
    params: list[Param] = []
    fixed: list[tuple[str, Any]] = []
    for name, spec in data.items():
        where = ("parameters", name)
        typ = KNOBS[name]
        if isinstance(spec, dict):
            _check_keys(space, spec, ("low", "high", "step", "log", "choices"), where)
            if "choices" in spec:
                if set(spec) - {"choices"} or not isinstance(spec["choices"], list) or not spec["choices"]:
                    raise space.error(
                        "choices must be a non-empty list, alone", where, hint="e.g. {choices: [16, 32]}"
                    )
                choices = tuple(_typed(space, name, v, where) for v in spec["choices"])
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
            log = bool(spec.get("log", False))
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
            raise space.error("a list of values must be written as choices", where, hint=f"write {name}: {{choices: {spec}}}")
        else:
            fixed.append((name, None if spec is None else _typed(space, name, spec, where)))
    return tuple(params), tuple(fixed)


def _typed(space: SearchSpace, name: str, value: Any, where: tuple[Any, ...]) -> Any:
    """``value`` checked against knob ``name``'s type and ServeConfig's own validation."""
    typ = KNOBS[name]
    ok = (
        (typ is bool and isinstance(value, bool))
        or (typ is int and isinstance(value, int) and not isinstance(value, bool))
        or (typ is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (typ is str and isinstance(value, str))
    )
    if not ok:
        raise space.error(f"{name} takes {typ.__name__} values, got {value!r}", where)
    if name == "kv_cache_dtype" and value not in KV_CACHE_DTYPES:
        raise space.error(f"kv_cache_dtype {value!r} is unknown", where, hint=f"use one of {', '.join(KV_CACHE_DTYPES)}")
    value = typ(value)
    if typ in (int, float):
        try:
            ServeConfig(**{name: value})
        except InputError as err:
            raise space.error(err.message, where, hint=err.hint) from err
    return value


def _parse_layouts(space: SearchSpace, data: Any) -> tuple[tuple[int, int], ...] | None:
    if data is None or data == "auto":
        return None
    if not isinstance(data, list) or not data:
        raise space.error(
            f"layouts must be 'auto' or a list, got {data!r}", ("layouts",),
            hint="e.g. layouts: [tp1x8, tp2x4, tp4x2]",
        )
    out = []
    for i, item in enumerate(data):
        try:
            out.append(parse_layout(item))
        except InputError as err:
            raise space.error(err.message, ("layouts", i), hint=err.hint) from err
    return tuple(dict.fromkeys(out))

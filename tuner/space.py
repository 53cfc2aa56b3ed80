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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any


from tuner.config import KV_CACHE_DTYPES, MAX_GPUS, Deployment, ServeConfig
from tuner.values import is_int, is_number, shown
from tuner.errors import InputError
from tuner.slo import Slo, SloSet, parse_slo, split_slos
from tuner.units import parse_seconds
from tuner.yamlfile import YamlDoc, line_of, parse_yaml, read_yaml

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
_WORKLOAD_KEYS = ("target_ttft_s", "slos", "trace", "requests", "rate", "load", "seed")
_LAYOUT_RE = re.compile(r"^tp(\d+)x(\d+)$")

#: Folder of the spaces shipped with the repository.
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "search_spaces"

# The ranges a workload may take (see also tuner.config's MAX_GPUS, MAX_TOKENS). Beyond
# them the value is a typo that would cost gigabytes or hours before the first trial.
#: Synthetic requests: every trial replays them a few times; 10M rows are ~0.5 GB of
#: columns, a day of busy traffic.
MAX_REQUESTS = 10_000_000
#: Seeds: numpy and Optuna take 32-bit seeds (0 <= seed < 2**32).
SEED_LIMIT = 2**32
#: Synthetic arrival rates, requests/s: from one request in 11.6 days to a million a
#: second; outside, arrival times stop being meaningful (1/rate overflows, or all at t=0).
MIN_RATE, MAX_RATE = 1e-6, 1e6
#: The P95 TTFT target: a day. A longer wait is not a latency target.
MAX_TTFT_S = 86_400.0
#: Choices of one knob: a sampler learns nothing over more; write a range.
MAX_CHOICES = 1024
#: Space names end up in study and file names (255 bytes on most file systems).
MAX_NAME = 100


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
    #: Service levels beyond P95 TTFT (``p99:tpot<=30ms``...), each met as well.
    slos: tuple[str, ...] = ()

    def slo_set(self) -> SloSet:
        """P95 TTFT at most ``target_ttft_s`` and every SLO of ``slos``."""
        return SloSet((Slo(95, "ttft", float(self.target_ttft_s)),) + tuple(parse_slo(t) for t in self.slos))

    def __post_init__(self) -> None:
        if not isinstance(self.slos, tuple) or any(parse_slo(t).name == "p95_ttft" for t in self.slos):
            raise InputError(f"slos must be a list of SLOs other than P95 TTFT, got {shown(self.slos)}",
                             hint="P95 TTFT is target_ttft_s")
        self.slo_set()
        ttft = self.target_ttft_s
        if not is_number(ttft) or not 0 < ttft <= MAX_TTFT_S:
            raise InputError(
                f"target_ttft_s must be in (0, {MAX_TTFT_S:g}] seconds (a day), got {shown(ttft)}",
                hint="write a duration such as 2s or 500ms",
            )
        if self.trace is not None and (not isinstance(self.trace, str) or not self.trace):
            raise InputError(f"trace must be the path of a request log, got {shown(self.trace)}")
        if self.load not in LOAD_KINDS:
            raise InputError(f"load {shown(self.load)} is not one of {', '.join(LOAD_KINDS)}")
        if not is_int(self.requests) or not 1 <= self.requests <= MAX_REQUESTS:
            raise InputError(
                f"requests must be a whole number in 1-{MAX_REQUESTS:,}, got {shown(self.requests)}",
                hint="more is more than tuner plans for; give a trace for real traffic",
            )
        if not is_number(self.rate) or not MIN_RATE <= self.rate <= MAX_RATE:
            raise InputError(
                f"rate must be in {MIN_RATE:g}-{MAX_RATE:g} requests/s, got {shown(self.rate)}"
            )
        if not is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT:
            raise InputError(f"seed must be a whole number in 0-{SEED_LIMIT - 1}, got {shown(self.seed)}")


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

    # -- identity ---------------------------------------------------------------------
    def content(self) -> dict[str, Any]:
        """What the space searches, as data: each knob's kind and range or choices, the fixed
        values and the layouts (not its name, comments, order or file). Part of a study's identity."""
        from tuner.jsonsafe import json_safe

        knobs = {}
        for p in sorted(self.params, key=lambda p: p.name):
            knob: dict[str, Any] = {"kind": p.kind}
            if p.choices:
                knob["choices"] = list(p.choices)
            else:
                knob.update({"low": p.low, "high": p.high, **({"step": p.step} if p.step is not None else {}),
                             **({"log": True} if p.log else {})})
            knobs[p.name] = knob
        return json_safe({"params": knobs, "fixed": dict(sorted(self.fixed)), "layouts": list(self.layout_choices)})

    def fingerprint(self) -> str:
        """12 hex digits of :meth:`content`: two files that parse to the same space share it."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.content(), sort_keys=True, default=str).encode()).hexdigest()[:12]

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

    def pinned(self, values: Mapping[str, Any], where: Mapping[str, str] | None = None) -> SearchSpace:
        """The space with each knob of ``values`` fixed at its value (taken out of the
        search), named ``<name>+max_num_seqs=256`` so that a pinned search is a study of its
        own. ``where`` names, per knob, what the user wrote (``--max-num-seqs``,
        ``--set block_size=32``) for the message when a value is not one the knob takes."""
        if not values:
            return self
        fixed = dict(self.fixed)
        for name, value in values.items():
            said = (where or {}).get(name, name)
            if name not in KNOBS:
                raise InputError(f"{said}: {shown(name)} is not a knob tuner can pin",
                                 hint=f"pin one of {', '.join(KNOBS)} (or its vLLM flag, --max-num-seqs)")
            fixed[name] = pin_value(name, value, said)
        params = tuple(p for p in self.params if p.name not in values)
        suffix = "+".join(f"{k}={v}" for k, v in sorted(values.items()))
        return _replace(self, params=params, fixed=tuple(fixed.items()), name=f"{self.name}+{suffix}")

    def with_workload(self, **changes: Any) -> SearchSpace:
        return _replace(self, workload=_replace(self.workload, **changes))

    def error(self, message: str, key: tuple[Any, ...], *, hint: str | None = None) -> InputError:
        """An :class:`InputError` pointing at ``key`` (a path of YAML keys) in the file."""
        line = line_of(self.lines, key)
        dotted = ".".join(str(k) if str(k).isprintable() else shown(k) for k in key)  # a key '\r' stays on one line
        return InputError(f"{dotted}: {message}" if dotted else message, path=self.path, line=line, hint=hint)


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


def load_space(name_or_path: str | Path = "default", *, trace: str | None = None) -> SearchSpace:
    """Read and validate a search space (a shipped name or a YAML path). ``trace`` (the
    command line's ``--trace``) replaces the space's own before anything is checked, so a
    space whose trace file is missing is still usable with another."""
    path = resolve_space_path(name_or_path)
    return _space_from(read_yaml(path, what="search space"), trace=trace)


def parse_space(text: str, *, path: str = "<space>", trace: str | None = None) -> SearchSpace:
    """Validate the search space in ``text`` (errors name ``path`` and the line)."""
    return _space_from(parse_yaml(text, path=path, what="search space"), trace=trace)


def _from_folder(doc: YamlDoc, value: Any) -> Any:
    """A relative file path written in the space file, resolved from that file's folder
    (not the working directory); anything else as written."""
    if not isinstance(value, str) or not value or doc.path == "<space>":
        return value
    path = Path(value).expanduser()
    return value if path.is_absolute() else str(Path(doc.path).parent / path)


def _space_from(doc: YamlDoc, *, trace: str | None = None) -> SearchSpace:
    path, data = doc.path, doc.data
    default_name = Path(path).stem if path != "<space>" else "space"
    stub = SearchSpace(default_name, Deployment(), WorkloadSpec(), path=path, lines=doc.lines)
    if not isinstance(data, dict):
        raise stub.error(f"a search space is a mapping of keys, this file holds {_kind(data)}", (),
                         hint="see search_spaces/default.yaml")
    _check_keys(stub, data, _TOP_KEYS, ())
    name = _text(stub, data.get("name"), ("name",), limit=MAX_NAME) or default_name
    description = _text(stub, data.get("description"), ("description",), limit=10_000)
    deployment = _parse_deployment(stub, _section(data, "deployment"))
    workload = _parse_workload(stub, _section(data, "workload"))
    if trace is not None:  # --trace: the space's own is never read (nor checked)
        workload = _replace(workload, trace=trace)
    elif workload.trace is not None:
        workload = _replace(workload, trace=_from_folder(doc, workload.trace))
    if deployment.calibration is not None:
        deployment = _replace(deployment, calibration=_from_folder(doc, deployment.calibration))
    params, fixed = _parse_parameters(stub, _section(data, "parameters"))
    layouts = _parse_layouts(stub, data.get("layouts", "auto"))
    _check_references(stub, deployment, workload)
    return SearchSpace(
        name=name,
        deployment=deployment,
        workload=workload,
        params=params,
        fixed=fixed,
        layouts=layouts,
        description=description,
        path=path,
        lines=doc.lines,
    )


def _kind(value: Any) -> str:
    """What a YAML value is, in words: "a list", "text", "nothing"."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    kinds = {str: "text", int: "a number", float: "a number", list: "a list", dict: "a mapping"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _section(data: dict[Any, Any], key: str) -> Any:
    """A section's mapping; an absent or empty one (``workload:``) is ``{}``."""
    value = data.get(key)
    return {} if value is None else value


def _text(space: SearchSpace, value: Any, where: tuple[Any, ...], *, limit: int) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise space.error(f"must be text, got {shown(value)}", where)
    text = str(value)
    if len(text) > limit:
        raise space.error(f"is {len(text):,} characters long, more than {limit:,}", where,
                          hint="keep it short: it becomes part of study names" if limit == MAX_NAME else None)
    return text


def _check_keys(space: SearchSpace, data: Any, known: Any, where: tuple[Any, ...]) -> None:
    if not isinstance(data, dict):
        raise space.error(f"expected a mapping of keys, got {_kind(data)}: {shown(data)}", where)
    for key in data:
        if key not in known:
            raise space.error(
                f"unknown key {shown(key)}", where + (key,), hint=f"known keys: {', '.join(sorted(known))}"
            )


def _parse_deployment(space: SearchSpace, data: Any) -> Deployment:
    _check_keys(space, data, _DEPLOYMENT_KEYS, ("deployment",))
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = "gpu_count" if key == "gpus" else key
        where = ("deployment", key)
        if name == "gpu_ids":
            if value is None:
                value = ()
            elif not isinstance(value, list):
                raise space.error(f"must be a list of device ids, got {shown(value)}", where, hint="e.g. gpu_ids: [0, 1]")
            value = tuple(value)
            probe: dict[str, Any] = {"gpu_ids": value, "gpu_count": max(len(value), 1)}
        else:
            probe = {name: value}
        try:  # one field at a time, so that the message points at its line
            Deployment(**probe)
        except InputError as err:
            raise space.error(_own(err.message, name), where, hint=err.hint) from err
        values[name] = value
    try:
        return Deployment(**values)
    except InputError as err:
        where = ("deployment", "gpu_ids") if "gpu_ids" in data else ("deployment",)
        raise space.error(err.message, where, hint=err.hint) from err


def _own(message: str, name: str) -> str:
    """``message`` without a leading ``name`` (the key in front of it says it already)."""
    return message[len(name) + 1:] if message.startswith(f"{name} ") else message


_EXPONENT = re.compile(r"\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]{1,4}\s*")


def _numeric(value: Any) -> Any:
    """``"1e6"`` (text to PyYAML, which wants ``1.0e+6``; a number in YAML 1.2) as a float;
    anything else unchanged."""
    if isinstance(value, str) and _EXPONENT.fullmatch(value):
        return _float(float(value))
    return value


def _whole(value: Any) -> Any:
    """An integral float (``1.0e+3``) as an int; anything else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def _parse_workload(space: SearchSpace, data: Any) -> WorkloadSpec:
    _check_keys(space, data, _WORKLOAD_KEYS, ("workload",))
    values: dict[str, Any] = {}
    for name, value in data.items():
        where = ("workload", name)
        try:
            if name == "target_ttft_s":
                value = parse_seconds(value, what="target_ttft_s")
            elif name == "slos":
                if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
                    raise InputError(f"must be a list of SLOs such as [p99:tpot<=30ms], got {shown(value)}")
                ttft, value = split_slos(value)
                if ttft is not None:
                    values["target_ttft_s"] = ttft
            elif name in ("requests", "seed", "rate"):
                value = _numeric(value)
                if not is_number(value):
                    raise InputError(f"must be a number, got {shown(value)}")
                value = _float(value) if name == "rate" else _whole(value)
            WorkloadSpec(**{name: value})
        except InputError as err:
            raise space.error(_own(err.message, name), where, hint=err.hint) from err
        values[name] = value
    return WorkloadSpec(**values)


def _float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


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
            if name not in _DEFAULT_NONE:
                raise space.error(f"{name} cannot be null", where, hint="leave the key out for vLLM's default")
            fixed.append((name, None))
        else:
            fixed.append((name, _typed(space, name, spec, where)))
    return tuple(params), tuple(fixed)


#: Knobs whose ``null`` means "vLLM's default" (ServeConfig fields that default to None).
_DEFAULT_NONE = {f.name for f in fields(ServeConfig) if f.default is None}


def _knob_problem(name: str, value: Any) -> tuple[str, str | None] | None:
    """What is wrong with ``value`` as knob ``name``'s (not its type, or a KV cache dtype vLLM
    does not have) as ``(message, hint)``; None when nothing is. A space file's value
    (:func:`_typed`) and a pinned one (:func:`pin_value`) are checked by it alike."""
    typ = KNOBS[name]
    ok = (
        (typ is bool and isinstance(value, bool))
        or (typ is int and is_int(value))
        or (typ is float and is_number(value))
        or (typ is str and isinstance(value, str))
    )
    if not ok:
        return f"{name} takes {typ.__name__} values, got {shown(value)}", None
    if name == "kv_cache_dtype" and value not in KV_CACHE_DTYPES:
        return f"kv_cache_dtype {shown(value)} is unknown", f"use one of {', '.join(KV_CACHE_DTYPES)}"
    return None


def _typed(space: SearchSpace, name: str, value: Any, where: tuple[Any, ...]) -> Any:
    """``value`` checked against knob ``name``'s type and ServeConfig's own validation."""
    typ = KNOBS[name]
    if typ in (int, float):
        value = _numeric(value)
        value = _whole(value) if typ is int else value
    problem = _knob_problem(name, value)
    if problem is not None:
        raise space.error(problem[0], where, hint=problem[1])
    value = _float(value) if typ is float else typ(value)
    if typ in (int, float):
        try:
            ServeConfig(**{name: value})
        except InputError as err:
            raise space.error(_own(err.message, name), where, hint=err.hint) from err
    return value


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def pin_value(name: str, value: Any, said: str) -> Any:
    """``value`` (typed, or text from ``--set``) as knob ``name`` takes it, checked as a
    space file's value is; InputError naming ``said`` (what the user wrote) otherwise."""
    typ = KNOBS[name]
    if isinstance(value, str) and typ is not str:
        text = value.strip().lower()
        try:
            if typ is bool:
                if text not in _TRUE + _FALSE:
                    raise ValueError(text)
                value = text in _TRUE
            else:
                value = typ(float(text)) if typ is int and float(text).is_integer() else typ(text)
        except ValueError:
            raise InputError(f"{said}: {name} takes {typ.__name__} values, got {shown(value)}",
                             hint="e.g. --set max_num_seqs=256, --set enforce_eager=true") from None
    problem = _knob_problem(name, value)
    if problem is not None:
        raise InputError(f"{said}: {problem[0]}", hint=problem[1])
    value = float(value) if typ is float else typ(value)
    try:
        ServeConfig(**{name: value})
    except InputError as err:
        raise InputError(f"{said}: {err.message}", hint=err.hint) from err
    return value


def _parse_layouts(space: SearchSpace, data: Any) -> tuple[tuple[int, int], ...] | None:
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


def _check_references(space: SearchSpace, deployment: Deployment, workload: WorkloadSpec) -> None:
    """The files and names the space refers to exist: model, GPU, calibration profile and
    trace (a problem inside one of those files is reported at that file's own line)."""
    from tuner.sim.calibration import load_calibration, memory_overrides
    from tuner.sim.hardware import get_gpu
    from tuner.sim.model import load_model

    def check(key: tuple[str, str], call: Any) -> Any:
        try:
            return call()
        except InputError as err:
            if err.path is not None:  # the referenced file's own fault, with its own line
                raise
            raise space.error(err.message, key, hint=err.hint) from err

    check(("deployment", "model"), lambda: load_model(deployment.model))
    gpu = check(("deployment", "gpu"), lambda: get_gpu(deployment.gpu))
    if deployment.calibration is not None:
        if not Path(deployment.calibration).expanduser().is_file():
            raise space.error(f"no calibration profile {deployment.calibration!r}", ("deployment", "calibration"),
                              hint="give the path of a profile.yaml (tuner calibrate writes one)")
        check(("deployment", "calibration"), lambda: load_calibration(gpu, deployment.calibration))
        check(("deployment", "calibration"),
              lambda: memory_overrides(gpu.name, deployment.vllm_version, deployment.calibration))
    if workload.trace is not None and not Path(workload.trace).expanduser().is_file():
        raise space.error(f"no such file {workload.trace!r} (a relative path is read from the space file's folder)",
                          ("workload", "trace"),
                          hint="give the path of a request log, or null for the synthetic mix; or --trace FILE")


def space_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What changed from one :meth:`SearchSpace.content` to another, in a few words:
    ``max_num_seqs choices [16, 64] -> [16, 32, 64]; enforce_eager removed``."""
    def short(v: Any) -> str:
        if isinstance(v, dict) and "choices" in v:
            return f"choices {v['choices']}"
        if isinstance(v, dict):
            return f"{v.get('low')}..{v.get('high')}" + (f" step {v['step']}" if "step" in v else "")
        return repr(v)

    parts: list[str] = []
    for section in ("params", "fixed"):
        a, b = old.get(section) or {}, new.get(section) or {}
        for name in sorted(set(a) | set(b)):
            if name not in b:
                parts.append(f"{name} removed")
            elif name not in a:
                parts.append(f"{name} added ({short(b[name])})")
            elif a[name] != b[name] and all(isinstance(v, dict) and "choices" in v for v in (a[name], b[name])):
                parts.append(f"{name} choices {a[name]['choices']} -> {b[name]['choices']}")
            elif a[name] != b[name]:
                parts.append(f"{name} {short(a[name])} -> {short(b[name])}")
    if old.get("layouts") != new.get("layouts"):
        parts.append(f"layouts {old.get('layouts')} -> {new.get('layouts')}")
    return "; ".join(parts) or "its content"

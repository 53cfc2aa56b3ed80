"""A parsed search space (:class:`SearchSpace`): binding to a deployment, sampling, identity,
pinning; and :func:`space_difference`."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.core.jsonsafe import json_safe
from tuner.core.values import shown
from tuner.core.yamlfile import line_of
from tuner.serving.config import Deployment, ServeConfig
from tuner.space.knob_values import KNOB_TYPES, pin_value
from tuner.space.param import (
    LAYOUT_PINS,
    MISSING,
    Param,
    choice_param,
    index_key,
    layout_name,
    parse_layout,
    pin_layout_value,
)
from tuner.space.workload import WorkloadSpec

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """A parsed search space. ``layouts`` is ``None`` for ``auto`` until :meth:`bind`;
    ``layout_pin`` (``(("tensor_parallel_size", 2),)``, :meth:`pinned`) keeps only the layouts
    that have those values, ``pin_said`` is what the user wrote for it."""

    name: str
    deployment: Deployment
    workload: WorkloadSpec
    params: tuple[Param, ...] = ()
    fixed: tuple[tuple[str, Any], ...] = ()
    layouts: tuple[tuple[int, int], ...] | None = None
    description: str = ""
    path: str = "<space>"
    lines: dict[tuple[Any, ...], int] = field(default_factory=dict, compare=False, repr=False)
    layout_pin: tuple[tuple[str, int], ...] = ()
    pin_said: str = field(default="", compare=False, repr=False)

    # -- binding to a deployment ------------------------------------------------------
    def bind(self, deployment: Deployment, num_heads: int) -> SearchSpace:
        """The space for ``deployment`` (whose model has ``num_heads`` attention heads):
        ``auto`` layouts resolved, explicit ones checked (tp x replicas <= GPUs, TP
        divides the heads), and those of a pinned TP or replica count kept."""
        gpus = deployment.gpu_count
        if self.layouts is None:
            tps = [tp for tp in (1, 2, 4, 8, 16, 32, 64) if tp <= gpus and num_heads % tp == 0]
            layouts = self._pinned_layouts(tuple((tp, gpus // tp) for tp in tps),
                                           f"auto: each TP that divides the {num_heads} attention heads of "
                                           f"{deployment.model}, replicas filling the {gpus} GPUs")
        else:
            layouts = self._pinned_layouts(self.layouts, "")
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

    def _pinned_layouts(self, layouts: tuple[tuple[int, int], ...], how: str) -> tuple[tuple[int, int], ...]:
        """``layouts`` with the pinned TP and replica count; none left is an InputError naming them all."""
        if not self.layout_pin:
            return layouts
        pin = dict(self.layout_pin)
        kept = tuple((tp, r) for tp, r in layouts
                     if pin.get("tensor_parallel_size", tp) == tp and pin.get("replicas", r) == r)
        if not kept:
            names = ", ".join(layout_name(tp, r) for tp, r in layouts) or "none"
            raise InputError(f"{self.pin_said} leaves no layout: the space has {names}" + (f" ({how})" if how else ""),
                             hint="pin the TP or replica count of one of them, or give the space a layout with it")
        return kept

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
        values.update({p.name: v for p in self.params if (v := p.read(params)) is not MISSING})
        return self._config(values, params.get("layout", self.layout_choices[0]))

    def encoded_for(self, param_names: Iterable[str]) -> SearchSpace:
        """The space as a study whose trials hold ``param_names`` stores it: ordered choices
        it keeps as ``<knob>_index`` (written before knobs were stored under their own names)
        stay indexed there, so that its sampler reads them and Optuna, which keeps one
        distribution per parameter in a study, accepts the new trials' values."""
        names = set(param_names)
        params = tuple(replace(p, indexed=p.kind == "ordinal" and index_key(p.name) in names) for p in self.params)
        return self if params == self.params else _replace(self, params=params)

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
        search), ``tensor_parallel_size`` and ``replicas`` keeping only the layouts with that
        value (at :meth:`bind`), named ``<name>+max_num_seqs=256`` so that a pinned search is a study of its
        own. ``where`` names, per knob, what the user wrote (``--max-num-seqs``,
        ``--set block_size=32``) for the message when a value is not one the knob takes."""
        if not values:
            return self
        fixed = dict(self.fixed)
        layout_pin: dict[str, int] = dict(self.layout_pin)
        saids: list[str] = [self.pin_said] if self.pin_said else []
        for name, value in values.items():
            said = (where or {}).get(name, name)
            if name in LAYOUT_PINS:
                layout_pin[name] = pin_layout_value(name, value, said)
                saids.append(said if said.startswith("--set") else
                             f"{said} {layout_pin[name]}" if said.startswith("--") else f"{name}={layout_pin[name]}")
                continue
            if name not in KNOB_TYPES:
                raise InputError(f"{said}: {shown(name)} is not a knob tuner can pin",
                                 hint=f"pin one of {', '.join((*KNOB_TYPES, *LAYOUT_PINS))} (or its vLLM flag, --max-num-seqs)")  # noqa: E501
            fixed[name] = pin_value(name, value, said)
        params = tuple(p for p in self.params if p.name not in values)
        suffix = "+".join(f"{k}={v}" for k, v in sorted({**values, **{k: layout_pin[k] for k in values if k in LAYOUT_PINS}}.items()))  # noqa: E501
        return _replace(self, params=params, fixed=tuple(fixed.items()), name=f"{self.name}+{suffix}",
                        layout_pin=tuple(sorted(layout_pin.items())), pin_said=" ".join(saids))

    def with_workload(self, workload: WorkloadSpec) -> SearchSpace:
        """The space with another workload section."""
        return _replace(self, workload=workload)

    def error(self, message: str, key: tuple[Any, ...], *, hint: str | None = None) -> InputError:
        """An :class:`InputError` pointing at ``key`` (a path of YAML keys) in the file."""
        line = line_of(self.lines, key)
        dotted = ".".join(str(k) if str(k).isprintable() else shown(k) for k in key)  # a key '\r' stays on one line
        return InputError(f"{dotted}: {message}" if dotted else message, path=self.path, line=line, hint=hint)


def _replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


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

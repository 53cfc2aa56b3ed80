"""Step-time calibration: the efficiency factors and overheads of one GPU class.

The roofline in :mod:`tuner.sim.steptime` turns a scheduled batch into bytes and FLOPs;
a :class:`Calibration` says how much of the datasheet bandwidth and FLOP/s vLLM really
gets on that class of GPU, and what each step costs beyond the roofline (kernel launches,
scheduler and sampler work, all-reduce latency). One YAML table per class ships in
``tuner/data/calibration/<class>.yaml``; every value there carries its source. A user
profile (``Deployment.calibration`` or ``path=``) is a YAML file with the same keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner.errors import InputError

if TYPE_CHECKING:
    from tuner.sim.hardware import GPU

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "calibration"

#: Launch modes of one step, cheapest first. ``graph``: a decode-only batch replayed from a
#: full CUDA graph; ``piecewise``: a mixed batch within the capture size (attention runs
#: outside the graphs); ``compiled``: torch.compile code without graphs (batches above the
#: capture size); ``eager``: ``--enforce-eager`` (no compile, no graphs).
LAUNCH_MODES = ("graph", "piecewise", "compiled", "eager")


@dataclass(frozen=True)
class Calibration:
    """Efficiencies (0-1] of the datasheet figures and per-step costs in seconds."""

    gpu_class: str
    hbm_efficiency: float
    flops_efficiency: float
    step_overhead_s: float                 # fixed per step: scheduler, input prep, sampler, output
    per_seq_overhead_s: float              # per scheduled request per step (CPU bookkeeping)
    launch_per_layer_s: dict[str, float]   # CPU time to launch one layer's kernels, per mode
    allreduce_latency_s: float             # one all-reduce of a small message
    link_efficiency: float                 # fraction of link_bandwidth an all-reduce reaches
    calibrated: bool = False               # True when fitted to real measurements of this class
    sources: dict[str, str] = field(default_factory=dict)
    path: str = ""

    def __post_init__(self) -> None:
        for name in ("hbm_efficiency", "flops_efficiency", "link_efficiency"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise InputError(f"calibration {name} must be in (0, 1], got {v}", path=self.path or None)
        for name in ("step_overhead_s", "per_seq_overhead_s", "allreduce_latency_s"):
            if getattr(self, name) < 0:
                raise InputError(f"calibration {name} must be >= 0", path=self.path or None)
        missing = [m for m in LAUNCH_MODES if m not in self.launch_per_layer_s]
        if missing:
            raise InputError(
                f"calibration launch_per_layer_s lacks {', '.join(missing)}",
                path=self.path or None, hint=f"give seconds for each of {', '.join(LAUNCH_MODES)}",
            )

    def replace(self, **changes: Any) -> Calibration:
        import dataclasses

        return dataclasses.replace(self, **changes)


def gpu_class(gpu: GPU) -> str:
    """Calibration class of a GPU, from its compute capability."""
    cc = tuple(gpu.compute_capability)
    if cc >= (10, 0):
        return "blackwell"
    if cc >= (9, 0):
        return "hopper"
    if cc == (8, 9):
        return "ada"
    if cc >= (8, 0):
        return "ampere"
    if cc >= (7, 5):
        return "turing"
    return "volta"


#: Sections a profile may carry beside the constants (``tuner calibrate`` writes them);
#: the step-time model ignores them.
EXTRA_SECTIONS = ("memory", "match", "fit", "fit_error", "errors", "notes", "meta", "measurements")


def _read_values(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"cannot read calibration: {exc}", path=path) from exc
    if not isinstance(raw, dict):
        raise InputError("calibration file must be a mapping of keys to {value, source}", path=path)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    known = {f.name for f in fields(Calibration)} - {"sources", "path"}
    for key, entry in raw.items():
        if key in EXTRA_SECTIONS:
            continue
        if key not in known:
            raise InputError(f"unknown calibration key {key!r}", path=path,
                             hint=f"known: {', '.join(sorted(known))}")
        if isinstance(entry, dict) and "value" in entry:
            values[key] = entry["value"]
            if entry.get("source"):
                sources[key] = str(entry["source"])
        else:
            values[key] = entry
    if "launch_per_layer_s" in values:
        if not isinstance(values["launch_per_layer_s"], dict):
            raise InputError("launch_per_layer_s must map launch modes to seconds", path=path)
        values["launch_per_layer_s"] = {k: float(v) for k, v in values["launch_per_layer_s"].items()}
    return values, sources


def _from_yaml(path: Path, base: Calibration | None = None) -> Calibration:
    """A calibration from YAML; keys it lacks come from ``base`` (a profile may override a
    few constants of the shipped table)."""
    values, sources = _read_values(path)
    if base is not None:
        merged = {f.name: getattr(base, f.name) for f in fields(Calibration)} | values
        merged["launch_per_layer_s"] = {**base.launch_per_layer_s, **values.get("launch_per_layer_s", {})}
        merged["sources"] = {**base.sources, **sources}
        merged["path"] = str(path)
        try:
            return Calibration(**merged)
        except TypeError as exc:
            raise InputError(f"bad calibration: {exc}", path=path) from exc
    try:
        return Calibration(**values, sources=sources, path=str(path))
    except TypeError as exc:
        raise InputError(f"incomplete calibration: {exc}", path=path) from exc


def load_calibration(gpu: GPU, path: str | None = None) -> Calibration:
    """The shipped table for ``gpu``'s class, or the profile YAML at ``path`` (constants it
    does not give come from the shipped table)."""
    cls = gpu_class(gpu)
    file = DATA_DIR / f"{cls}.yaml"
    if not file.exists():  # blackwell: no table yet, borrow hopper's
        file = DATA_DIR / "hopper.yaml"
    table = _from_yaml(file)
    if path is not None:
        return _from_yaml(Path(path), base=table)
    return table

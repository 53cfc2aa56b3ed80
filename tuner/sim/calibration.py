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
from functools import lru_cache
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
    request_latency_s: float = 0.0         # send -> engine sees the request (API server, HTTP); run_plan only
    sources: dict[str, str] = field(default_factory=dict)
    path: str = ""

    def __post_init__(self) -> None:
        for name in ("hbm_efficiency", "flops_efficiency", "link_efficiency"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise InputError(f"calibration {name} must be in (0, 1], got {v}", path=self.path or None)
        for name in ("step_overhead_s", "per_seq_overhead_s", "allreduce_latency_s", "request_latency_s"):
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


def load_calibration(gpu: GPU, path: str | None = None, vllm_version: str | None = None) -> Calibration:
    """The shipped table for ``gpu``'s class, or the profile YAML at ``path`` (constants it
    does not give come from the shipped table). Without ``path``, a fitted profile whose
    ``match`` names this GPU and ``vllm_version`` (:func:`find_profile`) applies."""
    if path is None and vllm_version:
        path = find_profile(gpu.name, vllm_version)
    cls = gpu_class(gpu)
    file = DATA_DIR / f"{cls}.yaml"
    if not file.exists():  # blackwell: no table yet, borrow hopper's
        file = DATA_DIR / "hopper.yaml"
    table = _from_yaml(file)
    if path is not None:
        return _from_yaml(Path(path), base=table)
    return table


# ------------------------------------------------------------------ fitted profiles
#: A fitted profile (``tuner calibrate``) is ``<dir>/<name>/profile.yaml``.
PROFILE_FILE = "profile.yaml"


def profile_dirs() -> list[Path]:
    """Where fitted profiles are looked for, first match wins: ``$TUNER_CALIBRATION_DIR``,
    ``~/.config/tuner/calibration`` (``tuner calibrate``'s default output), then the
    shipped ``tuner/data/calibration``."""
    import os

    dirs = []
    if os.environ.get("TUNER_CALIBRATION_DIR"):
        dirs.append(Path(os.environ["TUNER_CALIBRATION_DIR"]))
    dirs.append(Path.home() / ".config" / "tuner" / "calibration")
    dirs.append(DATA_DIR)
    return dirs


def _version_key(v: str) -> tuple[str, ...]:
    import re

    return tuple(re.findall(r"\d+", str(v))[:3])


def _gpu_key(name: str) -> str:
    from tuner.sim.hardware import get_gpu

    try:
        return get_gpu(str(name)).name.lower()
    except InputError:
        return str(name).lower()


@lru_cache(maxsize=128)
def _profile_section(path: str, mtime: float, section: str) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    value = raw.get(section) if isinstance(raw, dict) else None
    return dict(value) if isinstance(value, dict) else {}


def profile_section(path: str | Path, section: str) -> dict[str, Any]:
    """One section (``match``, ``memory``, ``fit``) of a profile YAML, cached per file version."""
    p = Path(path)
    try:
        mtime = p.stat().st_mtime
    except OSError:
        return {}
    return _profile_section(str(p), mtime, section)


def find_profile(gpu_name: str, vllm_version: str) -> str | None:
    """Path of the first fitted profile whose ``match`` names this GPU (catalog name or
    alias) and this vLLM version (major.minor.patch), or None."""
    want_gpu, want_version = _gpu_key(gpu_name), _version_key(vllm_version)
    for d in profile_dirs():
        if not d.is_dir():
            continue
        for file in sorted(d.glob(f"*/{PROFILE_FILE}")):
            match = profile_section(file, "match")
            if (match and _gpu_key(match.get("gpu", "")) == want_gpu
                    and _version_key(match.get("vllm_version", "")) == want_version):
                return str(file)
    return None


def memory_overrides(gpu_name: str, vllm_version: str, path: str | None = None) -> dict[str, float]:
    """The ``memory`` section (overrides of :data:`tuner.sim.memory.EMPIRICAL`) of the
    profile at ``path``, else of the matching fitted profile; empty when none applies."""
    if path is None:
        path = find_profile(gpu_name, vllm_version)
    if path is None:
        return {}
    return {str(k): float(v) for k, v in profile_section(path, "memory").items()}

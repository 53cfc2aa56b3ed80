"""Step-time calibration: the efficiency factors and overheads of one GPU class.

The roofline in :mod:`tuner.sim.steptime` turns a scheduled batch into bytes and FLOPs;
a :class:`Calibration` says how much of the datasheet bandwidth and FLOP/s vLLM really
gets on that class of GPU, and what each step costs beyond the roofline (kernel launches,
scheduler and sampler work, all-reduce latency). One YAML table per class ships in
``tuner/data/calibration/<class>.yaml``; every value there carries its source. A user
profile (``Deployment.calibration`` or ``path=``) is a YAML file with the same keys.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError, TunerWarning
from tuner.core.values import is_number, shown
from tuner.core.versions import same_version
from tuner.core.yamlfile import read_yaml
from tuner.sim.hardware import get_gpu

if TYPE_CHECKING:
    from tuner.core.yamlfile import YamlDoc
    from tuner.sim.hardware import GPU

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "calibration"

#: Launch modes of one step, cheapest first. ``graph``: a decode-only batch replayed from a
#: full CUDA graph; ``piecewise``: a mixed batch within the capture size (attention runs
#: outside the graphs); ``compiled``: torch.compile code without graphs (batches above the
#: capture size); ``eager``: ``--enforce-eager`` (no compile, no graphs).
LAUNCH_MODES = ("graph", "piecewise", "compiled", "eager")

_EFFICIENCIES = ("hbm_efficiency", "flops_efficiency", "link_efficiency", "moe_flops_efficiency", "moe_hbm_efficiency")
_SECONDS = ("step_overhead_s", "per_seq_overhead_s", "allreduce_latency_s", "request_latency_s",
            "frontend_per_token_s", "frontend_per_request_s", "moe_layer_s")
#: Upper bound of every per-step or per-request cost, seconds: real ones are micro- to
#: milliseconds, so seconds mean a unit slip (ms written as s) or a failed fit.
MAX_COST_S = 10.0
#: Upper bound of a ``memory`` override: 1 TiB, more than any GPU holds.
MAX_MEMORY_VALUE = float(1 << 40)


def _problem(name: str, value: Any) -> str | None:
    """What is wrong with constant ``name`` = ``value``, or None."""
    if name == "gpu_class":
        return None if isinstance(value, str) and value else f"gpu_class must be a name, got {shown(value)}"
    if name == "calibrated":
        return None if isinstance(value, bool) else f"calibrated must be true or false, got {shown(value)}"
    if name == "launch_per_layer_s":
        if not isinstance(value, dict):
            return f"launch_per_layer_s must map launch modes to seconds, got {shown(value)}"
        for mode, seconds in value.items():
            if mode not in LAUNCH_MODES:
                return f"launch_per_layer_s: unknown launch mode {shown(mode)} (known: {', '.join(LAUNCH_MODES)})"
            if not is_number(seconds) or not 0 <= seconds <= MAX_COST_S:
                return f"launch_per_layer_s.{mode} must be in 0-{MAX_COST_S:g} s, got {shown(seconds)}"
        return None
    if name == "moe_hbm_efficiency" and value is None:
        return None  # the routed experts stream at hbm_efficiency
    if name in _EFFICIENCIES:
        if not is_number(value) or not 0.0 < value <= 1.0:
            return f"calibration {name} must be in (0, 1], got {shown(value)}"
        return None
    if name in _SECONDS and (not is_number(value) or not 0 <= value <= MAX_COST_S):
        return f"calibration {name} must be in 0-{MAX_COST_S:g} s (>= 0), got {shown(value)}"
    return None


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
    # The API server streams every token the engine emits (detokenise, frame, send) in one
    # process beside the engine: a step's tokens cannot reach users faster than this many
    # seconds each, whatever the GPU does (0: not modelled).
    frontend_per_token_s: float = 0.0
    # ... and takes in every request (parse, validate, hand it to the engine) in the same
    # queue: a request that arrives while it streams a backlog waits behind it (0: not modelled).
    frontend_per_request_s: float = 0.0
    # Routed-expert GEMMs of an MoE layer (grouped, few tokens per expert) reach this share
    # of what the dense GEMMs reach (flops_efficiency); 1.0: the same.
    moe_flops_efficiency: float = 1.0
    # An MoE layer's fixed GPU time per step, seconds: the small kernels the bytes and FLOPs
    # do not account for (router GEMM, top-k softmax, the fused-MoE kernels' latency at a few
    # hundred programs, the sum of the k experts' outputs). A dense layer's are folded into
    # hbm_efficiency; an MoE layer's cannot be, since the expert bytes a step reads vary
    # sixteen-fold with the batch (0: not modelled).
    moe_layer_s: float = 0.0
    # The share of HBM peak the routed experts' weights stream at, once moe_layer_s carries
    # the MoE layers' fixed costs (None: hbm_efficiency, which folds a dense layer's).
    moe_hbm_efficiency: float | None = None
    sources: dict[str, str] = field(default_factory=dict)
    path: str = ""

    def __post_init__(self) -> None:
        for name in ("gpu_class", "launch_per_layer_s", *_EFFICIENCIES, *_SECONDS):
            problem = _problem(name, getattr(self, name))
            if problem:
                raise InputError(problem, path=self.path or None)
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

    doc = read_yaml(path, what="calibration profile")
    raw = doc.data
    if not isinstance(raw, dict):
        raise InputError("calibration file must be a mapping of keys to {value, source}", path=path,
                         line=doc.line())
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    known = {f.name for f in fields(Calibration)} - {"sources", "path"}
    for key, entry in raw.items():
        if key in ("memory", "match"):  # read elsewhere, checked here: a profile given by name says what is wrong
            _check_section(doc, key)
        if key in EXTRA_SECTIONS:
            continue
        if key not in known:
            raise InputError(f"unknown calibration key {shown(key)}", path=path, line=doc.line((key,)),
                             hint=f"known: {', '.join(sorted(known))}")
        where = (key,)
        if isinstance(entry, dict) and "value" in entry:
            value = entry["value"]
            source = entry.get("source")
            if source is not None and not isinstance(source, (str, int, float)):
                raise InputError(f"{key}.source must be text, got {shown(source)}", path=path,
                                 line=doc.line((key, "source")))
            if source:
                sources[key] = str(source)
            where = (key, "value")
        else:
            value = entry
        if isinstance(value, dict):
            value = dict(value)
        problem = _problem(key, value)
        if problem:
            raise InputError(problem, path=path, line=doc.line(where + _bad_mode(value)),
                             hint="see tuner/data/calibration/hopper.yaml for the layout")
        if key == "launch_per_layer_s":
            value = {k: float(v) for k, v in value.items()}
        values[key] = float(value) if key in _EFFICIENCIES + _SECONDS and value is not None else value
    return values, sources


def _bad_mode(value: Any) -> tuple[str, ...]:
    """The launch mode at fault in a ``launch_per_layer_s`` mapping, for its line."""
    if isinstance(value, dict):
        for mode, seconds in value.items():
            if mode not in LAUNCH_MODES or _problem("launch_per_layer_s", {mode: seconds}):
                return (str(mode),)
    return ()


def _from_yaml(path: Path, base: Calibration | None = None) -> Calibration:
    """A calibration from YAML; keys it lacks come from ``base`` (a profile may override a
    few constants of the shipped table)."""
    values, sources = _read_values(path)
    if base is not None:
        merged = {f.name: getattr(base, f.name) for f in fields(Calibration)} | values
        merged["launch_per_layer_s"] = {**base.launch_per_layer_s, **values.get("launch_per_layer_s", {})}
        merged["sources"] = {**base.sources, **sources}
        merged["path"] = str(path)
        return Calibration(**merged)
    required = [f.name for f in fields(Calibration) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in values]
    if missing:
        raise InputError(f"incomplete calibration: it lacks {', '.join(missing)}", path=path,
                         hint="a full table gives every constant; see tuner/data/calibration/hopper.yaml")
    return Calibration(**values, sources=sources, path=str(path))


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


def _gpu_key(name: str) -> str:

    try:
        return get_gpu(str(name)).name.lower()
    except InputError:
        return str(name).lower()


@lru_cache(maxsize=128)
def _profile_doc(path: str, mtime: float) -> YamlDoc:

    return read_yaml(path, what="calibration profile")


@lru_cache(maxsize=256)
def _profile_section(path: str, mtime: float, section: str, strict: bool) -> dict[str, Any]:
    try:
        doc = _profile_doc(path, mtime)
    except InputError:
        if strict:
            raise
        return {}
    raw = doc.data
    if not isinstance(raw, dict):
        if strict:
            raise InputError("calibration file must be a mapping of keys to {value, source}", path=path,
                             line=doc.line())
        return {}
    value = raw.get(section)
    if value is None or isinstance(value, dict):
        return dict(value or {})
    if strict:
        raise InputError(f"{section} must be a mapping, got {shown(value)}", path=path, line=doc.line((section,)))
    return {}


def profile_section(path: str | Path, section: str, *, strict: bool = False) -> dict[str, Any]:
    """One section (``match``, ``memory``, ``fit``) of a profile YAML, cached per file version.
    Tolerant (``{}`` for an unreadable file or section) unless ``strict``: then a problem is
    an :class:`InputError` naming the file and line."""
    p = Path(path)
    try:
        mtime = p.stat().st_mtime
    except OSError as err:
        if strict:
            raise InputError(f"cannot read calibration profile: {err.strerror}", path=p) from None
        return {}
    return _profile_section(str(p), mtime, section, strict)


def _check_section(doc: YamlDoc, name: str) -> dict[str, Any]:
    """The ``memory`` or ``match`` section of a profile, checked: a mapping (memory: of
    names to numbers, the overrides of :data:`tuner.sim.memory.EMPIRICAL`; match: ``gpu``
    and ``vllm_version`` as text)."""
    section = doc.data.get(name) if isinstance(doc.data, dict) else None
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise InputError(f"{name} must be a mapping, got {shown(section)}", path=doc.path, line=doc.line((name,)))
    for key, value in section.items():  # keys it does not know stay (another tuner version wrote them)
        line = doc.line((name, key))
        if not isinstance(key, str):
            raise InputError(f"{name}: a key must be a name, got {shown(key)}", path=doc.path, line=line)
        if name == "match":
            if key not in ("gpu", "vllm_version"):
                continue
            if not isinstance(value, str) or not value:
                raise InputError(f"match.{key} must be text, got {shown(value)}", path=doc.path, line=line,
                                 hint='quote versions: vllm_version: "0.26.0"')
            continue
        if key == "weight_overhead_by_model":  # model name -> bytes "Model loading took" beyond the shapes
            if not isinstance(value, dict) or not all(
                    isinstance(m, str) and is_number(v) and 0 <= v <= MAX_MEMORY_VALUE for m, v in value.items()):
                raise InputError(f"memory.{key} must map model names to bytes in 0-{MAX_MEMORY_VALUE:g}, "
                                 f"got {shown(value)}", path=doc.path, line=line)
            continue
        top = 1.0 if key == "cudagraph_kv_fraction" else MAX_MEMORY_VALUE
        if not is_number(value) or not 0 <= value <= top:
            raise InputError(f"memory.{key} must be a number in 0-{top:g}, got {shown(value)}", path=doc.path, line=line)  # noqa: E501
    return dict(section)


@lru_cache(maxsize=64)
def _memory_section(path: str, mtime: float) -> dict[str, Any]:
    """The ``memory`` section of the profile at ``path``, every value checked (numbers, and
    ``weight_overhead_by_model``: model names to numbers)."""
    _profile_section(path, mtime, "memory", True)  # the file reads, and is a mapping
    return {str(k): ({str(m): float(b) for m, b in v.items()} if isinstance(v, dict) else float(v))
            for k, v in _check_section(_profile_doc(path, mtime), "memory").items()}


def find_profile(gpu_name: str, vllm_version: str) -> str | None:
    """Path of the first fitted profile whose ``match`` names this GPU (catalog name or
    alias) and this vLLM version (major.minor.patch), or None."""
    want_gpu = _gpu_key(gpu_name)
    for d in profile_dirs():
        if not d.is_dir():
            continue
        for file in sorted(d.glob(f"*/{PROFILE_FILE}")):
            match = profile_section(file, "match")
            if not match:
                _warn_unreadable(file)
            gpu, version = match.get("gpu"), match.get("vllm_version")
            if (isinstance(gpu, str) and isinstance(version, str) and _gpu_key(gpu) == want_gpu
                    and same_version(str(version), str(vllm_version))):
                return str(file)
    return None


def _warn_unreadable(file: Path) -> None:
    """A profile passed over because it does not parse is said once per file version (a
    broken file in the calibration folder must not break runs, nor go unnoticed)."""
    try:
        _unreadable_once(str(file), file.stat().st_mtime)
    except OSError:
        pass


@lru_cache(maxsize=64)
def _unreadable_once(path: str, mtime: float) -> None:
    try:
        _profile_section(path, mtime, "match", True)
    except InputError as err:
        warnings.warn(f"passing over calibration profile {err}", TunerWarning, stacklevel=4)


def memory_overrides(gpu_name: str, vllm_version: str, path: str | None = None) -> dict[str, Any]:
    """The ``memory`` section (overrides of :data:`tuner.sim.memory.EMPIRICAL`) of the
    profile at ``path``, else of the matching fitted profile; empty when none applies."""
    if path is None:
        path = find_profile(gpu_name, vllm_version)
    if path is None:
        return {}
    try:
        mtime = Path(path).stat().st_mtime
    except OSError as err:
        raise InputError(f"cannot read calibration profile: {err.strerror}", path=path) from None
    return dict(_memory_section(str(path), mtime))

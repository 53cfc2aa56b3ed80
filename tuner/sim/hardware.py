"""GPU catalog: the figures the simulator needs about each accelerator.

The shipped catalog is ``tuner/data/gpus.yaml`` (every figure cites its datasheet).
Users add or override GPUs in ``$TUNER_GPU_CATALOG`` or ``~/.config/tuner/gpus.yaml``
with the same layout; errors there name the file and the key.

>>> get_gpu("h100").memory_bytes > 0
True
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.core.values import is_int, is_number, shown
from tuner.core.yamlfile import read_yaml

if TYPE_CHECKING:
    from collections.abc import Callable

    from tuner.core.yamlfile import YamlDoc

GB = 1e9
GiB = 1 << 30

_REQUIRED = (
    "memory_gib",
    "hbm_bandwidth_gbs",
    "fp16_tflops",
    "compute_capability",
    "interconnect",
    "link_bandwidth_gbs",
    "pcie_gen",
    "source",
)
_OPTIONAL = ("int8_tops", "device_name", "aliases", "bf16", "fp8")
_INTERCONNECTS = ("nvlink", "pcie")
#: Ceilings of a catalog entry's figures, far above any part (today: under 300 GiB, 10 TB/s,
#: a few thousand dense TFLOP/s): a larger figure is a unit slip (MiB for GiB, MB/s for GB/s).
_LIMITS = {
    "memory_gib": 16_384.0,
    "hbm_bandwidth_gbs": 1e6,
    "fp16_tflops": 1e6,
    "int8_tops": 1e6,
    "link_bandwidth_gbs": 1e6,
}


@dataclass(frozen=True, slots=True)
class GPU:
    """One accelerator. Bandwidths in bytes/s, throughputs in FLOP/s (or OP/s)."""

    name: str
    memory_bytes: int
    hbm_bandwidth: float
    fp16_flops: float
    int8_ops: float | None
    fp8: bool
    bf16: bool
    compute_capability: tuple[int, int]
    interconnect: str
    link_bandwidth: float
    pcie_gen: int
    source: str
    device_name: str = ""
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        figures = (self.memory_bytes, self.hbm_bandwidth, self.fp16_flops)
        if not all(is_number(v) and 0 < v < math.inf for v in figures):
            raise InputError(f"GPU {self.name}: memory, bandwidth and FLOP/s must be > 0")
        if self.interconnect not in _INTERCONNECTS:
            raise InputError(
                f"GPU {self.name}: interconnect {self.interconnect!r} is not one of nvlink, pcie"
            )
        if not (is_number(self.link_bandwidth) and 0 < self.link_bandwidth < math.inf):
            raise InputError(f"GPU {self.name}: link_bandwidth must be > 0")

    @property
    def cc(self) -> int:
        """Compute capability as vLLM writes it: 7.0 -> 70, 9.0 -> 90."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def torch_name(self) -> str:
        """What ``torch.cuda.get_device_name()`` prints (used in vLLM's messages)."""
        return self.device_name or self.name

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB


def _user_catalog_path() -> Path | None:
    env = os.environ.get("TUNER_GPU_CATALOG")
    if env:
        return Path(env).expanduser()
    default = Path("~/.config/tuner/gpus.yaml").expanduser()
    return default if default.exists() else None


def _parse_cc(value: Any, where: str, path: str, line: int | None = None) -> tuple[int, int]:
    text = str(value).strip() if isinstance(value, (str, int, float)) and not isinstance(value, bool) else ""
    major, dot, minor = text.partition(".")
    if dot and major.isdigit() and minor.isdigit() and 1 <= int(major) <= 99 and 0 <= int(minor) <= 9:
        return int(major), int(minor)
    raise InputError(
        f"{where}.compute_capability must look like \"8.9\" (major 1-99, minor 0-9), got {shown(value)}",
        path=path, line=line,
    )


def _check_keys(name: str, entry: Any, fail: Callable[..., InputError]) -> None:
    """A GPU entry is a mapping with every required key and no unknown one."""
    if not isinstance(entry, dict):
        raise fail(f"GPU {name!r} must be a mapping of fields, got {shown(entry)}")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise fail(f"GPU {name!r} lacks {', '.join(missing)}",
                   hint="see the header of tuner/data/gpus.yaml for the fields")
    unknown = sorted((k for k in entry if k not in _REQUIRED + _OPTIONAL), key=str)
    if unknown:
        raise fail(f"GPU {name!r} has unknown key(s) {', '.join(shown(k) for k in unknown)}", str(unknown[0]),
                   hint=f"known: {', '.join(_REQUIRED + _OPTIONAL)}")


def _check_kinds(name: str, entry: dict, fail: Callable[..., InputError]) -> tuple[str, int, list]:
    """The interconnect, PCIe generation and aliases of a GPU entry, checked (and its
    fp8/bf16 flags: true or false)."""
    interconnect = str(entry["interconnect"]).lower() if isinstance(entry["interconnect"], str) else None
    if interconnect not in _INTERCONNECTS:
        raise fail(f"{name}.interconnect must be nvlink or pcie, got {shown(entry['interconnect'])}", "interconnect")
    pcie_gen = entry["pcie_gen"]
    if not is_int(pcie_gen) or not 1 <= pcie_gen <= 7:
        raise fail(f"{name}.pcie_gen must be an integer 1-7, got {shown(pcie_gen)}", "pcie_gen")
    aliases = entry.get("aliases") or []
    if not isinstance(aliases, list) or not all(
            (isinstance(a, str) and a) or is_int(a) for a in aliases):
        raise fail(f"{name}.aliases must be a list of names, got {shown(aliases)}", "aliases")
    for flag in ("fp8", "bf16"):
        if flag in entry and not isinstance(entry[flag], bool):
            raise fail(f"{name}.{flag} must be true or false, got {shown(entry[flag])}", flag)
    return interconnect, pcie_gen, aliases


def _gpu_from_entry(name: str, entry: Any, path: str, doc: YamlDoc | None = None) -> GPU:
    def line(*key: str) -> int | None:
        return None if doc is None else doc.line((name, *key))

    def fail(message: str, *key: str, hint: str | None = None) -> InputError:
        return InputError(message, path=path, line=line(*key), hint=hint)

    _check_keys(name, entry, fail)

    def number(key: str, *, optional: bool = False) -> float | None:
        value = entry.get(key)
        if value is None and optional:
            return None
        top = _LIMITS[key]
        if not is_number(value) or not 0 < value <= top:
            raise fail(f"{name}.{key} must be a number in (0, {top:g}], got {shown(value)}", key)
        return float(value)

    def text(key: str) -> str:
        value = entry.get(key)
        if value is None:
            return ""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise fail(f"{name}.{key} must be text, got {shown(value)}", key)
        return str(value)

    cc = _parse_cc(entry["compute_capability"], name, path, line("compute_capability"))
    interconnect, pcie_gen, aliases = _check_kinds(name, entry, fail)
    int8 = number("int8_tops", optional=True)
    source = text("source")
    if not source:
        raise fail(f"{name}.source must say where the figures come from", "source")
    return GPU(
        name=name,
        memory_bytes=int(number("memory_gib") * GiB),
        hbm_bandwidth=number("hbm_bandwidth_gbs") * GB,
        fp16_flops=number("fp16_tflops") * 1e12,
        int8_ops=None if int8 is None else int8 * 1e12,
        # Native fp8 tensor cores arrived with Ada/Hopper (CC 8.9); bf16 with Ampere (CC 8.0).
        fp8=entry.get("fp8", cc >= (8, 9)),
        bf16=entry.get("bf16", cc >= (8, 0)),
        compute_capability=cc,
        interconnect=interconnect,
        link_bandwidth=number("link_bandwidth_gbs") * GB,
        pcie_gen=pcie_gen,
        source=source,
        device_name=text("device_name"),
        aliases=tuple(str(a) for a in aliases),
    )


def load_catalog(path: str | Path) -> dict[str, GPU]:
    """Read one catalog YAML: ``{name: {field: value}}``. Raises InputError naming file and line."""

    doc = read_yaml(path, what="GPU catalog")
    data = doc.data
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"GPU catalog must be a mapping of GPU name to fields, got {shown(data)}",
                         path=path, line=doc.line())
    out: dict[str, GPU] = {}
    for name, entry in data.items():
        if isinstance(name, bool) or not isinstance(name, (str, int, float)) or not str(name).strip():
            raise InputError(f"GPU name must be text, got {shown(name)}", path=path, line=doc.line((name,)))
        out[str(name)] = _gpu_from_entry(str(name), entry, str(path), doc)
    return out


@lru_cache(maxsize=1)
def _shipped() -> dict[str, GPU]:
    with resources.as_file(resources.files("tuner") / "data" / "gpus.yaml") as p:
        return load_catalog(p)


def catalog() -> dict[str, GPU]:
    """Shipped catalog, then the user's (which may replace shipped entries)."""
    gpus = dict(_shipped())
    user = _user_catalog_path()
    if user is not None:
        if not user.exists():
            raise InputError(
                "GPU catalog named by $TUNER_GPU_CATALOG does not exist", path=user
            )
        gpus.update(load_catalog(user))
    return gpus


def list_gpus() -> list[GPU]:
    """Every known GPU, shipped and user-defined."""
    return list(catalog().values())


def _key(text: str) -> str:
    return text.lower().replace("_", "-").replace(" ", "-")


def get_gpu(name: str) -> GPU:
    """Find a GPU by catalog name or alias, case-insensitively (``"h100"``, ``"v100-32gb"``)."""
    gpus = catalog()
    wanted = _key(name)
    family = [g.name for g in gpus.values() if _key(g.name).startswith(wanted + "-")]
    if len(family) > 1 and all(wanted != _key(g.name) for g in gpus.values()):
        # "a100" is the family of A100-40GB and A100-80GB: picking one silently would size
        # the KV cache for the wrong memory
        raise InputError(f"GPU {name!r} names several catalog entries", hint=f"say which: {', '.join(family)}")
    for gpu in gpus.values():
        if wanted == _key(gpu.name) or wanted in {_key(a) for a in gpu.aliases}:
            return gpu
    raise InputError(
        f"unknown GPU {name!r}",
        hint=f"known: {', '.join(gpus)}; add your own in $TUNER_GPU_CATALOG or "
        "~/.config/tuner/gpus.yaml",
    )

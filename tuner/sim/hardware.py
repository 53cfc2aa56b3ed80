"""GPU catalog: the figures the simulator needs about each accelerator.

The shipped catalog is ``tuner/data/gpus.yaml`` (every figure cites its datasheet).
Users add or override GPUs in ``$TUNER_GPU_CATALOG`` or ``~/.config/tuner/gpus.yaml``
with the same layout; errors there name the file and the key.

>>> get_gpu("h100").memory_bytes > 0
True
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import InputError

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
        if self.memory_bytes <= 0 or self.hbm_bandwidth <= 0 or self.fp16_flops <= 0:
            raise InputError(f"GPU {self.name}: memory, bandwidth and FLOP/s must be > 0")
        if self.interconnect not in _INTERCONNECTS:
            raise InputError(
                f"GPU {self.name}: interconnect {self.interconnect!r} is not one of nvlink, pcie"
            )
        if self.link_bandwidth <= 0:
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


def _parse_cc(value: Any, where: str, path: str) -> tuple[int, int]:
    text = str(value).strip()
    try:
        major, minor = text.split(".")
        return int(major), int(minor)
    except ValueError:
        raise InputError(
            f"{where}.compute_capability must look like \"8.9\", got {value!r}", path=path
        ) from None


def _gpu_from_entry(name: str, entry: Any, path: str) -> GPU:
    if not isinstance(entry, dict):
        raise InputError(f"GPU {name!r} must be a mapping of fields", path=path)
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise InputError(
            f"GPU {name!r} lacks {', '.join(missing)}",
            path=path,
            hint="see the header of tuner/data/gpus.yaml for the fields",
        )
    unknown = sorted(set(entry) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise InputError(
            f"GPU {name!r} has unknown key(s) {', '.join(unknown)}",
            path=path,
            hint=f"known: {', '.join(_REQUIRED + _OPTIONAL)}",
        )

    def number(key: str, *, optional: bool = False) -> float | None:
        value = entry.get(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise InputError(f"{name}.{key} must be a positive number, got {value!r}", path=path)
        return float(value)

    cc = _parse_cc(entry["compute_capability"], name, path)
    interconnect = str(entry["interconnect"]).lower()
    if interconnect not in _INTERCONNECTS:
        raise InputError(
            f"{name}.interconnect must be nvlink or pcie, got {entry['interconnect']!r}", path=path
        )
    pcie_gen = entry["pcie_gen"]
    if not isinstance(pcie_gen, int) or not 1 <= pcie_gen <= 7:
        raise InputError(f"{name}.pcie_gen must be an integer 1-7, got {pcie_gen!r}", path=path)
    int8 = number("int8_tops", optional=True)
    aliases = entry.get("aliases") or []
    if not isinstance(aliases, list):
        raise InputError(f"{name}.aliases must be a list of names", path=path)
    return GPU(
        name=name,
        memory_bytes=int(number("memory_gib") * GiB),
        hbm_bandwidth=number("hbm_bandwidth_gbs") * GB,
        fp16_flops=number("fp16_tflops") * 1e12,
        int8_ops=None if int8 is None else int8 * 1e12,
        # Native fp8 tensor cores arrived with Ada/Hopper (CC 8.9); bf16 with Ampere (CC 8.0).
        fp8=bool(entry.get("fp8", cc >= (8, 9))),
        bf16=bool(entry.get("bf16", cc >= (8, 0))),
        compute_capability=cc,
        interconnect=interconnect,
        link_bandwidth=number("link_bandwidth_gbs") * GB,
        pcie_gen=pcie_gen,
        source=str(entry["source"]),
        device_name=str(entry.get("device_name") or ""),
        aliases=tuple(str(a) for a in aliases),
    )


def load_catalog(path: str | Path) -> dict[str, GPU]:
    """Read one catalog YAML: ``{name: {field: value}}``. Raises InputError naming file and key."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"cannot read GPU catalog: {err.strerror}", path=path) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise InputError(f"GPU catalog is not valid YAML: {err}", path=path, line=line) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError("GPU catalog must be a mapping of GPU name to fields", path=path)
    return {str(name): _gpu_from_entry(str(name), entry, str(path)) for name, entry in data.items()}


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
    for gpu in gpus.values():
        if wanted == _key(gpu.name) or wanted in {_key(a) for a in gpu.aliases}:
            return gpu
    raise InputError(
        f"unknown GPU {name!r}",
        hint=f"known: {', '.join(gpus)}; add your own in $TUNER_GPU_CATALOG or "
        "~/.config/tuner/gpus.yaml",
    )

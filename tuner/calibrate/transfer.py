"""The transfer check: how well a profile fitted on one GPU's real points predicts another
GPU's real points that no fit saw. It is what a GPU kind never measured can be promised at
best: the H200 and the H100 share their SMs, clocks and software and differ in bandwidth and
memory, so the error between them is a floor under the error between classes.

* :func:`h200_only` is the shipped H200 profile as fitted on H200 points only (its two MoE
  constants were set from an H100 campaign afterwards, so they go back to the values before).
* :func:`errors_on` predicts a card's real load points and starts with a profile and gives the
  error per figure (:class:`TransferError`): tokens/s (prompt + output), P95 TTFT, KV tokens.
* :func:`fit_on` fits a profile on a card's points (``tuner calibrate``'s fit) for the reverse.

``benchmarks/transfer_check.py`` runs both directions and writes ``transfer.yaml`` beside the
two profiles it used (``tuner/data/calibration/transfer/``); :func:`read_transfer` reads it for
the fleet plan's bands (:mod:`tuner.fleet.bands`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner.calibrate.comparison import compare_loads, compare_startups
from tuner.calibrate.noise import measurement_noise, replicate_pairs
from tuner.calibrate.points import LoadPoint, Startup, load_points, point_name
from tuner.calibrate.profile import fit
from tuner.core.errors import InputError
from tuner.core.yamlfile import read_yaml
from tuner.serving.config import Deployment

DATA = Path(__file__).resolve().parents[1] / "data" / "calibration"
#: The committed result of the check, and the two profiles it compared.
TRANSFER_DIR = DATA / "transfer"
TRANSFER_FILE = TRANSFER_DIR / "transfer.yaml"
#: Campaign 5's warm-up probes (benchmarks/h200/campaign5/README.md: "not data"): each trial's
#: first probe and the first decode probe at each batch.
CAMPAIGN5_WARMUPS = tuple(
    f"{trial}: {probe} users" for trial in ("moe-small", "moe-small-again")
    for probe in ("decode x48 @ 32", "decode x1 @ 1", "decode x2 @ 2", "decode x4 @ 4", "decode x8 @ 8",
                  "decode x16 @ 16", "decode x32 @ 32", "mix x64 @ 64")) + ("q7-small: decode x48 @ 32 users",)


@dataclass(frozen=True, slots=True)
class TransferError:
    """A profile's error on a card's real points: MAPE in percent per figure (KV tokens over
    the starts vLLM logged a KV cache size for), the worst point, and how many points."""

    source: str                 # the card (and points) the profile was fitted on
    target: str                 # the card whose points it predicted
    points: int
    starts: int
    tokens_per_s_mape: float
    ttft_p95_mape: float
    kv_tokens_mape: float
    tokens_per_s_worst: float
    ttft_p95_worst: float
    kv_tokens_worst: float

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "transfer.yaml") -> TransferError:
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError) as err:
            raise InputError(f"{where}: a transfer entry lacks {err}",
                             hint="regenerate it: python benchmarks/transfer_check.py --write") from None


def _pct(table: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    return np.array([abs(r[f"{key}_predicted"] / r[f"{key}_measured"] - 1) * 100 for r in table
                     if r.get(f"{key}_measured")], dtype=float)


def errors_on(points: Sequence[LoadPoint], starts: Sequence[Startup], deployment: Deployment, *,
              source: str, calibration: Any = None) -> tuple[TransferError, list[dict[str, Any]]]:
    """The error of ``calibration`` (and ``deployment.calibration``'s memory section) on the
    real ``points`` and ``starts`` of ``deployment.gpu``; also the per-point table."""
    table = compare_loads(points, deployment, calibration)
    kv = np.array([abs(r["error_pct"]) for r in compare_startups([s for s in starts if s.ok], deployment)
                   if not math.isnan(r.get("error_pct", math.nan))], dtype=float)
    tok, ttft = _pct(table, "tokens_per_s"), _pct(table, "ttft_p95_s")

    def mean(a: np.ndarray) -> float:
        return float(a.mean()) if a.size else math.nan

    def top(a: np.ndarray) -> float:
        return float(a.max()) if a.size else math.nan

    return TransferError(source=source, target=deployment.gpu, points=len(table), starts=int(kv.size),
                         tokens_per_s_mape=mean(tok), ttft_p95_mape=mean(ttft), kv_tokens_mape=mean(kv),
                         tokens_per_s_worst=top(tok), ttft_p95_worst=top(ttft), kv_tokens_worst=top(kv)), table


def h200_only(shipped: str | Path, out: str | Path) -> Path:
    """The shipped H200 profile with its MoE layer cost and MoE streaming efficiency back at
    their values before campaign 5 (an H100) set them: the profile as fitted on H200 points
    only. Written to ``out``; returns it."""
    import yaml

    doc = yaml.safe_load(Path(shipped).read_text())
    doc["moe_layer_s"] = {"value": 0.0, "source": "reverted: campaign 5 (an H100) set it; the H200 fit never did"}
    doc["moe_hbm_efficiency"] = {"value": None, "source": "reverted: the experts stream at hbm_efficiency, "
                                                          "as the H200 fit had them"}
    doc["match"] = {}
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=110))
    return path


def fit_on(rows: Sequence[dict[str, Any]], deployment: Deployment, *, exclude: Sequence[str] = (),
           max_nfev: int | None = None, observer: Any = None) -> Any:
    """``tuner calibrate``'s fit (:func:`tuner.calibrate.fit`) on every load point and start
    of ``rows`` but ``exclude``: one start from the class table, the run-to-run noise from the
    rows' own replicate starts. Returns the :class:`~tuner.calibrate.FitResult`."""

    names = [point_name(p) for p in load_points(rows) if point_name(p) not in set(exclude)]
    noise = measurement_noise(rows, pairs=replicate_pairs(rows, exclude))
    return fit(rows, deployment, fit_points=names, exclude=exclude, noise=noise, starts=1, max_nfev=max_nfev,
               graph_fraction=0.0, observer=observer)


def read_transfer(path: str | Path = TRANSFER_FILE) -> dict[str, TransferError]:
    """The committed transfer errors by direction (``h200_to_h100``, ``h100_to_h200``, and the
    Hopper class table on the H100's points, ``hopper_table_on_h100``)."""

    doc = read_yaml(path, what="transfer check")
    data = doc.data.get("directions") if isinstance(doc.data, dict) else None
    if not isinstance(data, dict) or not data:
        raise InputError("no 'directions' in the transfer check", path=path,
                         hint="regenerate it: python benchmarks/transfer_check.py --write")
    return {str(k): TransferError.from_dict(v, str(path)) for k, v in data.items()}


__all__ = ["CAMPAIGN5_WARMUPS", "TRANSFER_DIR", "TRANSFER_FILE", "TransferError", "errors_on", "fit_on",
           "h200_only", "read_transfer"]

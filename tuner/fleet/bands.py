"""How sure a kind's figures are (:class:`Band`, :func:`band_for`): the simulator's typical
relative error there (MAPE) on tokens/s, P95 TTFT and KV tokens, and what it rests on.

* a profile fitted on the user's own GPU (``tuner calibrate``): its error on the points the fit
  held back (``fit.errors.check`` of the profile);
* the shipped H200 profile: the leave-one-shape-out error of the fidelity gate
  (``fidelity_gate.csv`` beside it: each group refitted without its own points), averaged over
  the groups of the traffic's arrival kind and launch mode, weighted by points;
* an H100 (the Hopper class table, no profile of its own): the larger of that and the table's
  error on the H100's own real points (campaigns 5 and 6) it was never fitted on;
* Volta (fitted on article 004's published table, no measurement of ours): the larger of the
  transfer error and that fit's worst row;
* a class never measured (Ampere, Ada, Turing): at least the transfer error between the H200 and
  the H100 (:mod:`tuner.calibrate.transfer`, the larger direction): NOT CALIBRATED.
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.calibrate.transfer import read_transfer
from tuner.core.errors import InputError
from tuner.sim.calibration import DATA_DIR, find_profile, gpu_class, load_calibration, profile_section
from tuner.sim.hardware import get_gpu

#: Volta's table fitted on article 004: tokens/s within -18 % .. +5 % of the article's seven
#: rows (tuner/data/calibration/volta.yaml); its worst row is its band's floor.
VOLTA_ARTICLE_WORST = 0.18
HINT = "NOT CALIBRATED: run `tuner calibrate` on one of these GPUs"


@dataclass(frozen=True, slots=True)
class Band:
    """Relative errors (0.07 = 7 %) of a kind's predictions and their basis. ``floor``: the
    band is a lower bound (a class never measured); ``calibrated``: measured on this class."""

    tokens_per_s: float
    ttft_p95: float
    kv_tokens: float
    basis: str
    calibrated: bool
    floor: bool = False
    profile: str | None = None

    def text(self, what: str = "tokens_per_s") -> str:
        return f"{'>=' if self.floor else '±'}{getattr(self, what) * 100:.0f} %"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Band:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _gate_band(folder: Path, *, eager: bool, closed: bool) -> tuple[float, float, int]:
    """Points-weighted leave-one-shape-out MAPE (tokens/s, P95 TTFT, as fractions) of the gate's
    groups of this arrival kind and launch mode, and how many points they hold."""
    path = folder / "fidelity_gate.csv"
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as err:
        raise InputError(f"cannot read the fidelity gate table: {err.strerror}", path=path) from None
    keep = [r for r in rows if ("eager" in r["group"]) == eager and (" closed " in r["group"]) == closed] or rows
    n = sum(int(r["points"]) for r in keep)
    tok = sum(float(r["tokens_per_s_loso"]) * int(r["points"]) for r in keep) / n
    ttft = sum(float(r["ttft_p95_loso"]) * int(r["points"]) for r in keep) / n
    return tok / 100, ttft / 100, n


def _transfer() -> dict[str, Any]:

    return read_transfer()


def _worst_transfer() -> tuple[float, float, float, str]:
    t = _transfer()
    a, b = t["h200_to_h100"], t["h100_to_h200"]
    return (max(a.tokens_per_s_mape, b.tokens_per_s_mape) / 100, max(a.ttft_p95_mape, b.ttft_p95_mape) / 100,
            max(a.kv_tokens_mape, b.kv_tokens_mape) / 100,
            f"H200->H100 {a.tokens_per_s_mape:.1f} % on {a.points} points, H100->H200 {b.tokens_per_s_mape:.1f} % on "
            f"{b.points} (tokens/s)")


def _user_band(path: str) -> Band:

    errors = profile_section(path, "fit").get("errors") or {}
    which = "check" if errors.get("check") else "fit"
    e = errors.get(which) or {}
    kv = (errors.get("kv") or {}).get("max_abs_error_pct")
    if not e:
        raise InputError("the profile records no fit errors (fit.errors)", path=path,
                         hint="write it with tuner calibrate, which checks it on the points it holds back")
    return Band(float(e["output_tokens_per_s_mape"]) / 100, float(e["ttft_p95_s_mape"]) / 100,
                float(kv or 0.0) / 100,
                f"your profile's error on the points its fit {'held back' if which == 'check' else 'saw (in-sample)'}",
                calibrated=True, profile=path)


def band_for(gpu_name: str, vllm_version: str, *, calibration: str | None = None, eager: bool = False,
             closed: bool = True) -> Band:
    """The band of ``gpu_name`` with ``vllm_version`` (a user's ``calibration`` profile, else
    the one the simulator finds, else the class table); ``eager`` and ``closed`` pick the
    fidelity groups of the configuration and traffic."""

    gpu = get_gpu(gpu_name)
    path = calibration or find_profile(gpu.name, vllm_version)
    shipped = DATA_DIR.resolve()
    if path is not None and shipped not in Path(path).resolve().parents:
        return _user_band(path)
    if path is not None:
        tok, ttft, n = _gate_band(Path(path).parent, eager=eager, closed=closed)
        kv = float((profile_section(path, "fit").get("errors") or {}).get("kv", {}).get("max_abs_error_pct") or 0)
        return Band(tok, ttft, kv / 100, f"leave-one-shape-out on {n} real {gpu.name} points (fidelity gate)",
                    calibrated=True, profile=path)
    cls = gpu_class(gpu)
    t_tok, t_ttft, t_kv, t_text = _worst_transfer()
    if cls == "hopper":
        tok, ttft, n = _gate_band(DATA_DIR / "h200-vllm-0.26.0", eager=eager, closed=closed)
        own = _transfer()["hopper_table_on_h100"]
        return Band(max(tok, own.tokens_per_s_mape / 100), max(ttft, own.ttft_p95_mape / 100),
                    own.kv_tokens_mape / 100,
                    f"Hopper table: {own.tokens_per_s_mape:.1f} % on {own.points} real H100 points it never saw; "
                    f"leave-one-shape-out {tok * 100:.1f} % on {n} H200 points", calibrated=True)
    if cls == "volta" and load_calibration(gpu).calibrated:  # fitted on a published table, not a measurement of ours
        return Band(max(t_tok, VOLTA_ARTICLE_WORST), t_ttft, t_kv,
                    f"fitted on article 004's published table (worst row {VOLTA_ARTICLE_WORST:.0%}), no measurement "
                    f"of ours; at least the transfer error ({t_text})", calibrated=True, floor=True)
    borrowed = "" if (DATA_DIR / f"{cls}.yaml").is_file() else ", on the Hopper table"
    return Band(t_tok, t_ttft, t_kv, f"NOT CALIBRATED ({cls}{borrowed}): at least the transfer error ({t_text})",
                calibrated=False, floor=True)


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two (low, high) intervals overlap: their options are a tie."""
    return a[0] <= b[1] and b[0] <= a[1] and not any(math.isnan(v) for v in (*a, *b))


__all__ = ["HINT", "VOLTA_ARTICLE_WORST", "Band", "band_for", "overlap"]

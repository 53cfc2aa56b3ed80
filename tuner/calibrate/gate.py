"""The fidelity gate: every committed real measurement grouped by shape, each group's raw
error recorded in a committed table, and a check that no change to the simulator or the
profile makes a group worse by more than its noise.

* :func:`group_of` names a load point's shape: model, arrival (closed loop, Poisson,
  bursty, a trace's own times), length distribution or trace, concurrency band, KV dtype,
  prefix sharing (and ``eager`` where CUDA graphs are off: another engine path).
* :func:`group_errors` gives each group's raw MAPE of tokens/s (prompt + output) and of
  P95 TTFT, with the group's noise: the standard error of its mean log error from the
  replicate starts (:func:`tuner.calibrate.fidelity.noise_by_bucket` per point, over the square root
  of the group's size), never below :data:`FLOOR_PP` points.
* :func:`regressions` compares a table against the committed one and names each group that
  got worse by more than its noise, or that appeared or vanished.
* :func:`leave_one_out` refits the profile without each group's points (only groups the fit
  saw need a refit: the others are held back already) and gives the group's error then.

Raw predictions only: the online correction of a running study is not applied here.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tuner.calibrate import (
    MEASUREMENTS,
    LoadPoint,
    fit,
    load_points,
    point_name,
    read_measurements,
    replicate_pairs,
)
from tuner.calibrate.fidelity import MODEL_LABELS, mape, noise_bucket, noise_by_bucket
from tuner.core.errors import TunerError
from tuner.serving.config import Deployment

#: The committed table, beside the measurements it was computed from.
TABLE = "fidelity_gate.csv"
#: A group's allowed worsening never goes below this many percentage points.
FLOOR_PP = 0.5
#: Closed-loop concurrency bands (upper bounds, inclusive).
BANDS = ((1, "1"), (16, "2-16"), (64, "17-64"), (256, "65-256"))
FIELDS = ("group", "points", "fitted", "tokens_per_s_mape", "tokens_per_s_noise", "ttft_p95_mape",
          "ttft_p95_noise", "tokens_per_s_loso", "ttft_p95_loso")


def _band(users: int) -> str:
    return next((name for top, name in BANDS if users <= top), f"{BANDS[-1][0] + 1}+")


def group_of(p: LoadPoint) -> str:
    """``7B mix closed 17-64 bf16``, ``7B mooncake_fast25_synthetic closed 2-16 bf16 shared prefixes``."""
    model = MODEL_LABELS.get(p.model or "qwen2.5-7b", p.model or "qwen2.5-7b")
    wl, ld = p.workload or {}, p.load or {"kind": "concurrency", "users": p.users}
    length = wl.get("trace") or wl.get("kind", "uniform")
    kind = ld.get("kind", "concurrency")
    if kind == "concurrency":
        arrival = f"closed {_band(int(ld.get('users', p.users)))}"
    elif kind == "poisson":
        arrival = "open poisson" if float(ld.get("burstiness", 1.0)) >= 1.0 else "open bursty"
    else:
        arrival = "open trace times"
    kv = "fp8" if str(p.config.kv_cache_dtype).startswith("fp8") else "bf16"
    parts = [model, length, arrival, kv]
    if wl.get("groups"):
        parts.append("unique prefixes" if wl.get("unique_prefixes") else "shared prefixes")
    if p.config.enforce_eager:
        parts.append("eager")
    return " ".join(parts)


@dataclass(frozen=True)
class GroupError:
    """One shape group's raw error (percent) and its noise (percentage points)."""

    group: str
    points: int
    fitted: int                              # how many of its points the shipped fit saw
    tokens_per_s_mape: float
    tokens_per_s_noise: float
    ttft_p95_mape: float
    ttft_p95_noise: float
    tokens_per_s_loso: float = math.nan      # refit without the whole group (leave_one_out)
    ttft_p95_loso: float = math.nan


def noise_pairs(folder: str | Path, rows: Sequence[dict[str, Any]],
                exclude: Sequence[str] = ()) -> list[tuple[LoadPoint, LoadPoint]]:
    """Replicate starts: fresh starts inside the campaigns, and campaign 1 against its replicate file.
    A pair with an ``exclude``d point is no replicate (campaign 2's cold MoE probe against campaign 4's
    warm one differs by the Triton compile, not by the start)."""
    again = Path(folder) / "replicate.jsonl"
    extra = []
    if again.is_file():
        later = load_points(read_measurements(again))
        extra = [(a, b) for a in load_points(read_measurements(Path(folder) / MEASUREMENTS))
                 for b in later if a.key == b.key]
    skip = set(exclude)
    return [(a, b) for a, b in replicate_pairs(rows, skip) + extra if point_name(a) not in skip and point_name(b) not in skip]  # noqa: E501


def _noise_pp(points: Sequence[LoadPoint], sd: dict[str, float]) -> float:
    per = [sd.get(noise_bucket(p), max(sd.values())) for p in points]
    return max(FLOOR_PP, 100.0 * math.sqrt(sum(s * s for s in per) / len(per)) / math.sqrt(len(per)))


def group_errors(points: Sequence[LoadPoint], table: Sequence[dict[str, Any]],
                 pairs: Sequence[tuple[LoadPoint, LoadPoint]], fitted: set[str] = frozenset()) -> list[GroupError]:
    """Each group's MAPE from ``table`` (:func:`tuner.calibrate.compare_loads` rows of
    ``points``, same order) with its noise from the replicate ``pairs``."""
    sd_tok = noise_by_bucket(pairs, "output_tokens_per_s")
    sd_ttft = noise_by_bucket(pairs, "ttft_p95_s")
    groups: dict[str, list[tuple[LoadPoint, dict[str, Any]]]] = {}
    for p, r in zip(points, table):
        groups.setdefault(group_of(p), []).append((p, r))
    out = []
    for name, members in sorted(groups.items()):
        pts, rs = [m[0] for m in members], [m[1] for m in members]
        out.append(GroupError(name, len(pts), sum(point_name(p) in fitted or p.trial in fitted for p in pts),
                              mape(rs, "tokens_per_s"), _noise_pp(pts, sd_tok),
                              mape(rs, "ttft_p95_s"), _noise_pp(pts, sd_ttft)))
    return out


def regressions(current: Sequence[GroupError], committed: Sequence[GroupError]) -> list[str]:
    """One line per group worse than the committed table by more than its noise (or new, or gone)."""
    now, then = {g.group: g for g in current}, {g.group: g for g in committed}
    out = [f"{name}: not in the committed table (regenerate it: python benchmarks/fidelity_gate.py --write)"
           for name in now if name not in then]
    out += [f"{name}: in the committed table but no longer measured" for name in then if name not in now]
    for name in now.keys() & then.keys():
        g, c = now[name], then[name]
        for what, key, tol in (("tokens/s", "tokens_per_s_mape", c.tokens_per_s_noise),
                               ("P95 TTFT", "ttft_p95_mape", c.ttft_p95_noise)):
            a, b = getattr(g, key), getattr(c, key)
            if not math.isnan(a) and a > b + tol:
                out.append(f"{name}: {what} MAPE {a:.1f} % against the committed {b:.1f} % "
                           f"(noise {tol:.1f} points)")
    return sorted(out)


def write_table(path: str | Path, groups: Sequence[GroupError]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(FIELDS)
        for g in groups:
            w.writerow([g.group, g.points, g.fitted] + [f"{getattr(g, f):.2f}" for f in FIELDS[3:]])


def read_table(path: str | Path) -> list[GroupError]:
    p = Path(path)
    if not p.is_file():
        raise TunerError(f"no fidelity gate table at {p}: write it with python benchmarks/fidelity_gate.py --write")
    with open(p, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    try:
        return [GroupError(r["group"], int(r["points"]), int(r["fitted"]),
                           *(float(r[f]) for f in FIELDS[3:])) for r in rows]
    except (KeyError, ValueError) as exc:
        raise TunerError(f"{p}: bad fidelity gate table ({exc}); regenerate it with "
                         "python benchmarks/fidelity_gate.py --write") from exc


def leave_one_out(rows: Sequence[dict[str, Any]], points: Sequence[LoadPoint], deployment: Deployment,
                  profile: dict[str, Any], groups: Sequence[GroupError], *, start: Any,
                  noise: dict[str, float] | None = None, max_nfev: int | None = None,
                  log: Callable[[str], None] | None = None) -> list[GroupError]:
    """``groups`` with each one's error when the fit (``profile``'s fit section, less the
    group's points) never saw the group. Groups the fit did not see keep their error."""
    info = profile["fit"]
    chosen = list(info["fit_points"])
    out = []
    for g in groups:
        if not g.fitted:
            out.append(replace(g, tokens_per_s_loso=g.tokens_per_s_mape, ttft_p95_loso=g.ttft_p95_mape))
            continue
        members = [p for p in points if group_of(p) == g.group]
        names = {point_name(p) for p in members}
        # a whole trial named in the fit keeps its other groups' points, named one by one
        keep = [n for n in chosen if n not in names and ":" in n]
        for t in (n for n in chosen if ":" not in n):
            keep += [point_name(p) for p in points if p.trial == t and point_name(p) not in names]
        res = fit(rows, deployment, fit_points=keep, exclude=info.get("excluded") or [], noise=noise,
                  graph_fraction=0.0, start=start, max_nfev=max_nfev)
        held = [r for r in res.table if r["name"] in names]
        out.append(replace(g, tokens_per_s_loso=mape(held, "tokens_per_s"), ttft_p95_loso=mape(held, "ttft_p95_s")))
        if log:
            log(f"{g.group}: refit without {len(members)} points: tokens/s {out[-1].tokens_per_s_loso:.1f} % "
                f"(in-sample {g.tokens_per_s_mape:.1f} %), P95 TTFT {out[-1].ttft_p95_loso:.1f} %")
    return out


__all__ = ["BANDS", "FIELDS", "FLOOR_PP", "GroupError", "TABLE", "group_errors", "group_of",
           "leave_one_out", "noise_pairs", "read_table", "regressions", "write_table"]

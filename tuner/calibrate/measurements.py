"""The measurement files of a calibration: ``measurements.jsonl`` and the later campaigns
beside it (:func:`read_measurements`, :func:`campaign_rows`), and the name lists of a
profile folder (:func:`read_names`: ``fit_points.txt``, ``excluded_points.txt``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError

MEASUREMENTS = "measurements.jsonl"


def read_measurements(path: str | Path) -> list[dict[str, Any]]:
    """The JSON lines of a measurements file (a missing file is empty); a torn last line
    (a run killed mid-write) is skipped."""
    p = Path(path)
    if p.is_dir():
        p = p / MEASUREMENTS
    if not p.exists():
        return []
    rows = []
    for k, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as err:
            if k == len(p.read_text().splitlines()):
                continue
            raise InputError(f"bad JSON line: {err}", path=p, line=k) from err
    return rows


def read_names(path: str | Path) -> list[str]:
    """Point or trial names, one a line (``#`` starts a comment; the text after `` # `` on a
    line is a reason, kept out of the name): ``fit_points.txt``, ``excluded_points.txt``."""
    out = []
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        line = raw.split(" # ", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def campaign_rows(folder: str | Path) -> list[dict[str, Any]]:
    """Every measurement of a profile folder: ``measurements.jsonl``, then each later
    campaign on the same GPU and vLLM version in name order, whether a file beside it
    (``campaign2.jsonl``) or a folder of its own (``campaign3/measurements.jsonl``, kept
    with its logs); ``replicate.jsonl`` stays apart, it repeats trials under the same names."""
    p = Path(folder)
    rows = read_measurements(p / MEASUREMENTS)
    later = [f for f in p.glob("campaign*.jsonl") if f.is_file()]
    later += [d / MEASUREMENTS for d in p.glob("campaign*") if d.is_dir() and (d / MEASUREMENTS).is_file()]
    for extra in sorted(later, key=lambda f: f.relative_to(p).parts[0].removesuffix(".jsonl")):
        rows += read_measurements(extra)
    return rows


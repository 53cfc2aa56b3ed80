"""Any CSV or JSON-lines log, given which column holds what.

``mapping`` names the columns (JSON keys may be dotted paths, ``response.usage.prompt_tokens``)::

    {"prompt_tokens": "in_len", "output_tokens": "out_len",      # required
     "arrival": "ts", "time_unit": "ms",                          # optional; s, ms, us, ns, datetime
     "session": "conv", "turn": "turn_no"}                        # optional

On the command line: ``--format generic --map prompt_tokens=in_len --map output_tokens=out_len
--map arrival=ts --map time_unit=ms``. Without ``arrival`` every request is at t=0.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tuner.core.errors import InputError
from tuner.traffic._rows import BadRows, dig, iter_jsonl, read_text
from tuner.traffic._table import TIME_UNITS, Table, read_csv, to_workload
from tuner.traffic.workload import Workload

KEYS = ("arrival", "prompt_tokens", "output_tokens", "session", "turn", "time_unit")
HINT = "map columns with --map prompt_tokens=COL --map output_tokens=COL [--map arrival=COL]"


def check_mapping(mapping: dict[str, str] | None) -> dict[str, str]:
    if not mapping:
        raise InputError("the generic format needs a column mapping", hint=HINT)
    unknown = sorted(set(mapping) - set(KEYS))
    if unknown:
        raise InputError(f"unknown mapping key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}", hint=HINT)
    for need in ("prompt_tokens", "output_tokens"):
        if not mapping.get(need):
            raise InputError(f"the mapping lacks {need}", hint=HINT)
    unit = mapping.get("time_unit", "auto")
    if unit not in (*TIME_UNITS, "datetime", "auto"):
        raise InputError(f"time_unit {unit!r} is not one of s, ms, us, ns, datetime", hint=HINT)
    return dict(mapping)


def read(path: str, *, skip_bad: bool = False, mapping: dict[str, str] | None = None, **_: object) -> Workload:
    m = check_mapping(mapping)
    bad = BadRows(path, skip_bad)
    text_head = read_text(path)[:4096].lstrip()
    if text_head.startswith("{"):
        table = _jsonl_table(path, m, bad)
    else:
        unit = m.get("time_unit", "auto")
        table = read_csv(path, bad, date_column=m.get("arrival") if unit in ("auto", "datetime") else None)
    return to_workload(
        path, table, bad,
        arrival=m.get("arrival"), prompt=m["prompt_tokens"], output=m["output_tokens"],
        session=m.get("session"), turn=m.get("turn"), time_unit=m.get("time_unit", "auto"),
        fmt="generic", hint=HINT,
    )


def _jsonl_table(path: str, m: dict[str, str], bad: BadRows) -> Table:
    cols = [m[k] for k in ("arrival", "prompt_tokens", "output_tokens", "session", "turn") if m.get(k)]
    lines: list[int] = []
    data: dict[str, list] = {c: [] for c in cols}
    seen: set[str] = set()
    for line, obj in iter_jsonl(read_text(path), bad):
        lines.append(line)
        for c in cols:
            v = dig(obj, c)
            if v is not None:
                seen.add(c)
            data[c].append(v)
    # a key absent from every row is a missing column, reported like a CSV header
    frame = pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in data.items() if c in seen})
    return Table(frame, np.asarray(lines, dtype=np.int64), header_line=lines[0] if lines else 1)

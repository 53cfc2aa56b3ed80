"""The tuner's own workload JSONL, written by ``tuner trace convert`` and read back
losslessly (same fingerprint, notes and flags).

Line 1 is a header, every further line one request::

    {"tuner_workload": 1, "origin": "conv.csv", "block_tokens": 512, "estimated_tokens": false,
     "columns": ["session", "turn", "hash_ids"], "notes": [], "count": 19366}
    {"t": 0.0, "in": 374, "out": 44}
    {"t": 4.3145788, "in": 396, "out": 109, "session": "c1", "turn": 0, "hash_ids": [0, 1]}

``t`` is seconds (written with Python's shortest exact float repr, so it round-trips).

``origin`` is where the requests came from (the log that was converted; files written
before it was named so say ``source``). It is provenance only: the workload read back
has the file itself as its ``source``, so that whoever replays it (a study, a plan)
names the file it read, never the log behind it; the origin becomes the first note,
``converted from conv.csv`` (kept, not repeated, when a converted file is converted again).
"""
from __future__ import annotations

import json
from pathlib import Path

from tuner.core.errors import InputError
from tuner.traffic._rows import (
    BAD_VALUE,
    UNPARSEABLE_TIME,
    BadRows,
    Clock,
    Collected,
    SkipRow,
    iter_jsonl,
    read_text,
    to_hash_ids,
    to_length,
    to_number,
)
from tuner.traffic.workload import Workload

MAGIC = "tuner_workload"
VERSION = 1
#: The note that names the log a tuner file was converted from.
CONVERTED_FROM = "converted from "


def write(workload: Workload, path: str | Path) -> Path:
    """Write ``workload`` as tuner JSONL; returns the path."""
    out = Path(path)
    columns = [name for name in ("session", "turn", "hash_ids") if getattr(workload, name) is not None]
    header = {
        MAGIC: VERSION, "origin": workload.source, "block_tokens": workload.block_tokens,
        "estimated_tokens": bool(workload.estimated_tokens), "columns": columns,
        "notes": list(workload.notes), "count": len(workload),
    }
    t = workload.arrival_s.tolist()
    p = workload.prompt_tokens.tolist()
    o = workload.output_tokens.tolist()
    turn = workload.turn.tolist() if workload.turn is not None else None
    try:
        with out.open("w", encoding="utf-8") as f:
            f.write(json.dumps(header, ensure_ascii=False) + "\n")
            for i in range(len(t)):
                row: dict[str, object] = {"t": t[i], "in": p[i], "out": o[i]}
                if workload.session is not None:
                    row["session"] = workload.session[i]
                if turn is not None:
                    row["turn"] = turn[i]
                if workload.hash_ids is not None:
                    row["hash_ids"] = [int(h) for h in workload.hash_ids[i]]
                f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    except OSError as err:
        raise InputError(f"cannot write: {err.strerror or err}", path=out) from None
    return out


def read(path: str, *, skip_bad: bool = False, **_: object) -> Workload:
    bad = BadRows(path, skip_bad)
    rows = Collected()
    clock = Clock(bad, "t")
    header: dict | None = None
    for line, obj in iter_jsonl(read_text(path), bad):
        if header is None:
            if obj.get(MAGIC) != VERSION:
                raise InputError(f"not a tuner workload file: line 1 lacks {{\"{MAGIC}\": {VERSION}}}",
                                 path=path, line=line, hint="write one with `tuner trace convert`")
            header = obj
            continue
        try:
            t = to_number(obj.get("t"), "t", line, bad, UNPARSEABLE_TIME)
            p = to_length(obj.get("in"), "in", line, bad)
            o = to_length(obj.get("out"), "out", line, bad)
            session = obj.get("session")
            if session is not None and not isinstance(session, str):
                raise bad.row(line, BAD_VALUE, "session must be a string or null")
            turn = to_length(obj.get("turn", 0), "turn", line, bad)
            ids = to_hash_ids(obj.get("hash_ids", []), line, bad)
            clock.check(t, line)
        except SkipRow:
            continue
        rows.add(t, p, o, session=session, turn=turn, hash_ids=ids)
    if header is None:
        raise InputError("empty file: no header and no rows", path=path)
    count = header.get("count")
    if isinstance(count, int) and not bad.skipped and count != len(rows.t):
        raise InputError(f"the header says {count} requests but the file holds {len(rows.t)}", path=path,
                         hint="the file was cut short or edited; convert the source trace again")
    columns = header.get("columns", [])
    block = header.get("block_tokens", 512)
    notes = header.get("notes", [])
    if not isinstance(columns, list) or not isinstance(block, int) or block < 1 or not isinstance(notes, list):
        raise InputError("bad header: columns must be a list, block_tokens a positive integer, notes a list",
                         path=path, line=1)
    notes = [str(n) for n in notes]
    origin = header.get("origin", header.get("source"))
    if origin and str(origin) != path and not any(n.startswith(CONVERTED_FROM) for n in notes):
        notes.insert(0, CONVERTED_FROM + str(origin))
    w = rows.workload(
        path, bad, block_tokens=block, estimated=bool(header.get("estimated_tokens", False)),
        notes=tuple(notes), rebase=False, source=path, keep_hash_ids="hash_ids" in columns,
    )
    # Sessions and turns exactly as written (Collected infers them from the values).
    from dataclasses import replace

    return replace(
        w,
        session=list(rows.session) if "session" in columns else None,
        turn=rows.turn if "turn" in columns else None,
        notes=tuple(notes) + bad.notes(),
    )

"""Mooncake trace JSONL (Qin et al., "Mooncake", FAST'25; github.com/kvcache-ai/Mooncake,
``FAST25-release/traces``): one object per line with ``timestamp`` (milliseconds),
``input_length``, ``output_length`` and ``hash_ids``, the ids of the prompt's
512-token blocks (equal ids mean an equal prefix up to and including that block).
"""
from __future__ import annotations

from tuner.traffic._rows import (
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

BLOCK_TOKENS = 512  # Mooncake README: "hash_ids ... each block contains 512 tokens"


def read(path: str, *, skip_bad: bool = False, **_: object) -> Workload:
    bad = BadRows(path, skip_bad)
    clock = Clock(bad)
    rows = Collected()
    for line, obj in iter_jsonl(read_text(path), bad):
        try:
            t_ms = to_number(obj.get("timestamp"), "timestamp", line, bad, UNPARSEABLE_TIME)
            p = to_length(obj.get("input_length"), "input_length", line, bad)
            o = to_length(obj.get("output_length"), "output_length", line, bad)
            ids = to_hash_ids(obj.get("hash_ids", []), line, bad)
            clock.check(t_ms, line)
        except SkipRow:
            continue
        rows.add(t_ms / 1000.0, p, o, hash_ids=ids)
    return rows.workload(path, bad, block_tokens=BLOCK_TOKENS)

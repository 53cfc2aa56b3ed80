"""Speed of reading an Azure-format trace: ``tuner.traffic.load_trace`` (pandas C reader,
numpy checks) beside plain ``csv`` module parsing of the same file (split, parse the
timestamp and both integers, check they are non-negative and in order), which is what a
hand-written loader does.

    python benchmarks/trace_load.py [ROWS]      # default 1,000,000 rows; goal: < 5 s
"""
from __future__ import annotations

import csv
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from tuner.core.errors import InputError
from tuner.traffic import load_trace


def make_file(path: Path, rows: int, seed: int = 0) -> None:
    """An Azure-conversation-like CSV: Poisson arrivals at 5.5 req/s, lognormal lengths."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / 5.5, rows))
    ctx = np.maximum(1, rng.lognormal(6.7, 0.9, rows)).astype(np.int64)
    gen = np.clip(rng.lognormal(4.9, 0.9, rows), 1, 1000).astype(np.int64)
    t0 = datetime(2023, 11, 16, 18, 15, 46)
    stamps = (np.datetime64(t0) + (t * 1e7).astype("timedelta64[100ns]") * 1).astype(str)
    with path.open("w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        f.writelines(f"{s.replace('T', ' ')},{c},{g}\n" for s, c, g in zip(stamps, ctx.tolist(), gen.tolist()))


def csv_module(path: Path) -> int:
    n = 0
    last = None
    with path.open(newline="") as f:
        reader = csv.reader(f)
        next(reader)
        for ts, c, g in reader:
            when = datetime.fromisoformat(ts[:26])  # fromisoformat takes at most 6 fractional digits
            ctx, gen = int(c), int(g)
            if ctx < 0 or gen < 0 or (last is not None and when < last):
                raise ValueError(f"bad row {reader.line_num}")
            last = when
            n += 1
    return n


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "azure_like.csv"
        t = time.perf_counter()
        make_file(path, rows)
        print(f"generated {rows:,} rows ({path.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        w = load_trace(path)
        ours = time.perf_counter() - t
        assert len(w) == rows
        t = time.perf_counter()
        n = csv_module(path)
        base = time.perf_counter() - t
        assert n == rows
        # one bad row near the end: how long until the user reads file:line?
        lines = path.read_text().splitlines(keepends=True)
        k = len(lines) - 10
        lines[k] = lines[k].replace(",", ",-", 1)
        path.write_text("".join(lines))
        t = time.perf_counter()
        try:
            load_trace(path)
        except InputError as err:
            message = str(err).replace(str(path), path.name)
        bad = time.perf_counter() - t
    print(f"{'reader':<28}{'seconds':>10}{'rows/s':>14}")
    print(f"{'tuner load_trace':<28}{ours:>10.2f}{rows / ours:>14,.0f}")
    print(f"{'csv module + datetime':<28}{base:>10.2f}{rows / base:>14,.0f}")
    print(f"{'tuner, bad row near the end':<28}{bad:>10.2f}{'':>14}  -> {message}")
    print(f"speed-up {base / ours:.1f}x; goal < 5 s for 1M rows: {'met' if ours < 5 else 'MISSED'} ({ours:.2f} s)")


if __name__ == "__main__":
    main()

"""Column-wise trace reading: CSV (or records) to a :class:`Workload`, vectorised.

A million-row CSV is parsed by pandas' C reader and checked with numpy masks; only
when something is wrong is the first bad row located for the message (its line number
is its row index plus the header's line, since blank lines are kept as empty rows).
Files pandas cannot split (quoted fields, ragged rows) go through the ``csv`` module
row by row, which is slower but knows every row's line.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tuner.core.errors import InputError
from tuner.traffic._rows import (
    BACKWARDS,
    MISSING,
    NEGATIVE,
    UNPARSEABLE,
    UNPARSEABLE_TIME,
    BadRows,
    SkipRow,
    read_bytes,
)
from tuner.traffic.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

# pandas is imported where a table is read, not with the module: every `tuner` command
# imports the trace readers, and most (sim-serve above all) never read a CSV.

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass
class Table:
    """Raw columns (as parsed) with the file line of every row."""

    frame: pd.DataFrame
    lines: np.ndarray
    header_line: int

    def column(self, *names: str) -> pd.Series | None:
        """The first column whose name matches one of ``names`` (case and spaces ignored)."""
        import pandas as pd
        wanted = [_norm(n) for n in names]
        cols = {_norm(str(c)): c for c in reversed(list(self.frame.columns))}
        for w in wanted:
            if w in cols:
                got = self.frame[cols[w]]
                return got.iloc[:, 0] if isinstance(got, pd.DataFrame) else got
        return None

    @property
    def header(self) -> str:
        text = ", ".join(str(c) for c in self.frame.columns)
        text = text.replace("\r", "\\r").replace("\n", "\\n")
        return text if len(text) <= 120 else text[:117] + "..."


def _norm(name: str) -> str:
    return "".join(name.lower().split()).replace("_", "")


def read_csv(path: str, bad: BadRows, *, date_column: str | None = None) -> Table:
    """Read a CSV. ``date_column`` (if its first value is not a number) is parsed as
    ISO 8601 date-times by the C reader itself, ten times faster than parsing strings
    afterwards; a column with unparseable values comes back as strings and
    :func:`times` finds the bad row."""
    import pandas as pd
    data = read_bytes(path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    body = data.lstrip(b" \t\r\n")
    header_line = data[: len(data) - len(body)].count(b"\n") + 1
    if not body.strip():
        raise InputError("empty file: no header and no rows", path=path)
    if b'"' not in body and b"\r" not in body and b"\x00" not in body:
        dates = _date_column(body, date_column)
        try:
            frame = pd.read_csv(
                io.BytesIO(body), skip_blank_lines=False, encoding_errors="replace", low_memory=False,
                parse_dates=dates, date_format="ISO8601" if dates else None,
            )
        except pd.errors.ParserError:
            pass  # ragged rows: the csv module below names the line
        except (pd.errors.EmptyDataError, UnicodeDecodeError, ValueError, OverflowError):
            pass
        else:
            lines = np.arange(len(frame), dtype=np.int64) + header_line + 1
            blank = frame.isna().all(axis=1).to_numpy() if len(frame.columns) else np.zeros(len(frame), bool)
            if blank.any():
                frame, lines = frame[~blank].reset_index(drop=True), lines[~blank]
            return Table(frame, lines, header_line)
    return _read_csv_slow(path, body.decode("utf-8", errors="replace"), header_line, bad)


def _date_column(body: bytes, name: str | None) -> list[str] | None:
    if name is None:
        return None
    head = body[:4096].decode("utf-8", errors="replace").splitlines()
    header = head[0].split(",")
    norm = [_norm(h) for h in header]
    if _norm(name) not in norm or len(head) < 2:
        return None
    k = norm.index(_norm(name))
    cells = head[1].split(",")
    if k >= len(cells):
        return None
    try:
        float(cells[k])
        return None
    except ValueError:
        return [header[k]] if header.count(header[k]) == 1 else None


def _read_csv_slow(path: str, text: str, header_line: int, bad: BadRows) -> Table:
    import pandas as pd
    reader = csv.reader(io.StringIO(text.replace("\x00", "")))
    rows: list[list[str | None]] = []
    lines: list[int] = []
    try:
        header = next(reader)
        start = reader.line_num + 1
        seen: dict[str, int] = {}
        names = []
        for h in header:  # duplicate names get .1, .2 like pandas does
            k = seen.get(h, 0)
            seen[h] = k + 1
            names.append(h if k == 0 else f"{h}.{k}")
        for row in reader:
            line = start + header_line - 1
            start = reader.line_num + 1
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) > len(names):
                try:
                    raise bad.row(line, "too many fields", f"{len(row)} fields, the header has {len(names)}")
                except SkipRow:
                    continue
            rows.append(row + [None] * (len(names) - len(row)))
            lines.append(line)
    except StopIteration:
        raise InputError("empty file: no header and no rows", path=path) from None
    except csv.Error as err:
        raise InputError(f"cannot split into CSV fields: {err}", path=path,
                         line=reader.line_num + header_line - 1) from None
    frame = pd.DataFrame(rows, columns=names, dtype=object) if rows else pd.DataFrame(columns=names)
    return Table(frame, np.asarray(lines, dtype=np.int64), header_line)


# -- columns -> workload ------------------------------------------------------------------
Check = tuple[np.ndarray, str, Callable[[int], str]]


def numeric(s: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, missing, unparseable)`` for a column of numbers (NaN where not a number)."""
    import pandas as pd
    if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        v = s.to_numpy(dtype=np.float64, na_value=np.nan)
        missing = np.isnan(v)
        return v, missing, ~np.isfinite(v) & ~missing
    if s.dtype == object:  # values from JSON may be lists, dicts, booleans: not numbers
        s = s.map(lambda x: x if x is None or (isinstance(x, (int, float, str)) and not isinstance(x, bool))
                  else "?")
    missing = s.isna().to_numpy().copy()
    v = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan).copy()
    bad = (np.isnan(v) & ~missing) | np.isinf(v) | (np.abs(np.nan_to_num(v)) > 1e18)
    if bad.any():  # blanks and padded numbers are not errors: look again at just those rows
        idx = np.flatnonzero(bad)
        text = s.iloc[idx].astype(str).str.strip()
        blank = text.eq("") | text.str.lower().isin(("nan", "none", "null"))
        missing[idx[blank.to_numpy()]] = True
        again = pd.to_numeric(text.where(~blank, None), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        v[idx] = again
        bad = (np.isnan(v) & ~missing) | np.isinf(v) | (np.abs(np.nan_to_num(v)) > 1e18)
    return v, missing, bad


def times(s: pd.Series, unit: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(seconds, missing, unparseable)``: numbers in ``unit`` (``auto`` = seconds) or
    date-times (``datetime``, or ``auto`` when most values are not numbers)."""
    import pandas as pd
    if pd.api.types.is_datetime64_any_dtype(s):
        missing = s.isna().to_numpy()
        secs = np.full(len(s), np.nan)
        if (~missing).any():
            secs = (s - s[~missing].min()).dt.total_seconds().to_numpy(dtype=np.float64, na_value=np.nan)
        return secs, missing, np.zeros(len(s), dtype=bool)
    if unit != "datetime":
        if unit != "auto" or pd.api.types.is_numeric_dtype(s) or _mostly_numbers(s):
            v, missing, bad = numeric(s)
            return v * TIME_UNITS.get(unit, 1.0), missing, bad
    if s.dtype == object:
        s = s.map(lambda x: x if x is None or isinstance(x, str) else str(x))
    missing = s.isna().to_numpy().copy()
    dt = _datetimes(s).copy()
    failed = dt.isna().to_numpy() & ~missing
    if failed.any():  # padded or blank values: retry those rows stripped
        idx = np.flatnonzero(failed)
        text = s.iloc[idx].astype(str).str.strip()
        blank = text.eq("").to_numpy()
        missing[idx[blank]] = True
        dt.iloc[idx] = _datetimes(text.where(~blank, None))
    ok = dt.notna().to_numpy()
    secs = np.full(len(s), np.nan)
    if ok.any():
        secs = (dt - dt[ok].min()).dt.total_seconds().to_numpy(dtype=np.float64, na_value=np.nan)
    return secs, missing, np.isnan(secs) & ~missing


def _mostly_numbers(s: pd.Series) -> bool:
    import pandas as pd
    head = s.dropna().head(200)
    if head.dtype == object:
        head = head.map(lambda x: x if isinstance(x, (int, float, str)) and not isinstance(x, bool) else "?")
    return bool(pd.to_numeric(head, errors="coerce").notna().mean() > 0.5) if len(head) else True


def _datetimes(s: pd.Series) -> pd.Series:
    import pandas as pd
    try:
        return pd.to_datetime(s, format="ISO8601", errors="coerce", utc=True)
    except (ValueError, TypeError, OverflowError):
        try:
            return pd.to_datetime(s, format="mixed", errors="coerce", utc=True)
        except (ValueError, TypeError, OverflowError):
            return pd.Series(pd.NaT, index=s.index, dtype="datetime64[ns, UTC]")


def _raw(s: pd.Series, i: int) -> str:
    import pandas as pd
    value = s.iloc[i]
    if isinstance(value, pd.Timestamp):
        return str(value)
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def length_checks(s: pd.Series, name: str) -> tuple[np.ndarray, list[Check]]:
    v, missing, unparse = numeric(s)
    with np.errstate(invalid="ignore"):
        frac = ~unparse & ~missing & (v != np.floor(v))
        negative = ~unparse & ~missing & ~frac & (v < 0)
    return v, [
        (missing, MISSING, lambda i: f"{name} is empty"),
        (unparse, UNPARSEABLE, lambda i: f"{name} is {_raw(s, i)}"),
        (frac, UNPARSEABLE, lambda i: f"{name} is {_raw(s, i)}, not a whole number of tokens"),
        (negative, NEGATIVE, lambda i: f"{name} is {_raw(s, i)}"),
    ]


def resolve(bad: BadRows, lines: np.ndarray, checks: Sequence[Check]) -> np.ndarray:
    """Rows to drop. Without ``skip_bad`` raises for the earliest bad row of all checks;
    with it, counts each dropped row once, under the first check that caught it."""
    n = len(lines)
    if not bad.skip_bad:
        firsts = [(int(np.argmax(m)), k) for k, (m, _, _) in enumerate(checks) if m.any()]
        if firsts:
            i, k = min(firsts)
            _, reason, detail = checks[k]
            raise bad.error(int(lines[i]), reason, detail(i))
        return np.zeros(n, dtype=bool)
    drop = np.zeros(n, dtype=bool)
    for mask, reason, _ in checks:
        new = mask & ~drop
        if new.any():
            bad.count(reason, int(lines[int(np.argmax(new))]), int(new.sum()))
            drop |= mask
    return drop


def backwards(t: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Rows (among ``keep``) whose time is earlier than some kept row before them."""
    masked = np.where(keep, t, -np.inf)
    prev_max = np.maximum.accumulate(masked)
    before = np.concatenate(([-np.inf], prev_max[:-1])) if len(t) else prev_max
    return keep & (t < before)


def to_workload(
    path: str,
    table: Table,
    bad: BadRows,
    *,
    arrival: str | None,
    prompt: str,
    output: str,
    session: str | None = None,
    turn: str | None = None,
    time_unit: str = "auto",
    source: str | None = None,
    fmt: str,
    hint: str,
) -> Workload:
    """Validate the named columns of ``table`` and build the workload."""
    def need(name: str | None) -> pd.Series | None:
        if name is None:
            return None
        col = table.column(name)
        if col is None:
            raise InputError(
                f"{MISSING} {name!r} for the {fmt} format (the header has: {table.header})",
                path=path, line=table.header_line, hint=hint,
            )
        return col

    p_col, o_col, t_col = need(prompt), need(output), need(arrival)
    s_col, turn_col = need(session), need(turn)
    prompt_v, checks = length_checks(p_col, prompt)
    output_v, more = length_checks(o_col, output)
    checks += more
    t, more = _arrival_checks(t_col, arrival, time_unit, len(table.lines))
    checks += more
    turn_v = None
    if turn_col is not None:
        turn_v, more = length_checks(turn_col, turn)
        checks += more
    if t_col is not None:
        checks.append(_backwards_check(t, checks, t_col, arrival))
    keep = ~resolve(bad, table.lines, checks)
    if not keep.any():
        raise InputError(
            f"no usable requests ({bad.skipped} bad rows skipped)" if bad.skipped else "no requests in the file",
            path=path,
        )
    t = t[keep]
    t = t - t[0]
    return Workload(
        arrival_s=t,
        prompt_tokens=prompt_v[keep].astype(np.int64),
        output_tokens=output_v[keep].astype(np.int64),
        session=None if s_col is None else _sessions(s_col[keep]),
        turn=None if turn_v is None else turn_v[keep].astype(np.int64),
        source=source or path,
        notes=bad.notes(),
    )


def _arrival_checks(t_col: pd.Series | None, arrival: str | None, time_unit: str, n: int) -> tuple[np.ndarray, list]:
    """The arrival times (zeros without an arrival column) and the checks of its rows."""
    if t_col is None:
        return np.zeros(n), []
    t, t_missing, t_bad = times(t_col, time_unit)
    return t, [
        (t_missing, MISSING, lambda i: f"{arrival} is empty"),
        (t_bad, UNPARSEABLE_TIME, lambda i: f"{arrival} is {_raw(t_col, i)}"),
    ]


def _backwards_check(t: np.ndarray, checks: list, t_col: pd.Series, arrival: str | None) -> tuple:
    """The check of rows whose time goes back, among the rows the other ``checks`` keep."""
    keep = ~np.logical_or.reduce([m for m, _, _ in checks]) if checks else np.ones(len(t), bool)

    def back_detail(i: int) -> str:
        j = int(np.flatnonzero(keep[:i])[-1]) if keep[:i].any() else i
        return f"{arrival} {_raw(t_col, i)} comes after {_raw(t_col, j)}"

    return backwards(t, keep), BACKWARDS, back_detail


def _sessions(col: pd.Series) -> list[str | None]:
    """Session ids as text (an empty cell: None)."""
    return [None if (x is None or (isinstance(x, float) and np.isnan(x))) else str(x) for x in col.astype(object)]

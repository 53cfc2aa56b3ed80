"""Shared machinery of the trace readers: reporting bad rows, reading the file,
iterating JSON lines, and checking numbers one row at a time.

Every reader reports a malformed row as ``file:line: what is wrong`` and stops, unless
``skip_bad`` is set; then :class:`BadRows` counts the skipped rows per reason and
:meth:`BadRows.notes` summarises them for ``Workload.notes``.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError
from tuner.traffic.workload import Workload

SKIP_HINT = "use --skip-bad to skip bad rows"

# Reasons, worded as the user reads them after "file:line: ".
UNPARSEABLE = "unparseable number"
UNPARSEABLE_TIME = "unparseable timestamp"
NEGATIVE = "negative length"
BACKWARDS = "timestamps going backwards"
MISSING = "missing column"
BAD_JSON = "not valid JSON"
BAD_VALUE = "bad value"


class SkipRow(Exception):
    """Raised by :meth:`BadRows.row` under ``skip_bad``: the caller drops the row."""


class BadRows:
    """Collects bad rows of one file: raises at the first unless ``skip_bad``."""

    def __init__(self, path: str | Path, skip_bad: bool) -> None:
        self.path = str(path)
        self.skip_bad = skip_bad
        self.counts: Counter[str] = Counter()
        self.first_line: dict[str, int] = {}

    def error(self, line: int | None, reason: str, detail: str = "") -> InputError:
        text = f"{reason}: {detail}" if detail else reason
        return InputError(text, path=self.path, line=line, hint=SKIP_HINT)

    def row(self, line: int, reason: str, detail: str = "") -> SkipRow:
        """Report one bad row: raises :class:`InputError`, or counts it and raises
        :class:`SkipRow` when skipping (``raise bad.row(...)`` reads well either way)."""
        if not self.skip_bad:
            raise self.error(line, reason, detail)
        self.count(reason, line)
        raise SkipRow

    def count(self, reason: str, first_line: int, n: int = 1) -> None:
        self.counts[reason] += n
        self.first_line[reason] = min(first_line, self.first_line.get(reason, first_line))

    @property
    def skipped(self) -> int:
        return sum(self.counts.values())

    def notes(self) -> tuple[str, ...]:
        if not self.counts:
            return ()
        parts = ", ".join(
            f"{n} {reason} (first at line {self.first_line[reason]})"
            for reason, n in sorted(self.counts.items(), key=lambda kv: -kv[1])
        )
        return (f"skipped {self.skipped} bad rows: {parts}",)


def read_text(path: str | Path) -> str:
    """The file as text (UTF-8; undecodable bytes become U+FFFD and then fail as values)."""
    return read_bytes(path).decode("utf-8-sig", errors="replace")


def read_bytes(path: str | Path) -> bytes:
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise InputError("no such file", path=p, hint="check the path") from None
    except IsADirectoryError:
        raise InputError("is a directory, not a trace file", path=p) from None
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror or err}", path=p) from None


def iter_jsonl(text: str, bad: BadRows) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line holding a JSON object."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as err:
            try:
                raise bad.row(lineno, BAD_JSON, _json_reason(err))
            except SkipRow:
                continue
        if not isinstance(obj, dict):
            try:
                raise bad.row(lineno, BAD_JSON, f"expected an object {{...}}, found {type(obj).__name__}")
            except SkipRow:
                continue
        yield lineno, obj


def _json_reason(err: Exception) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} at column {err.colno}"
    if isinstance(err, RecursionError):
        return "nested too deeply"
    return str(err)


def dig(obj: Any, dotted: str) -> Any:
    """``obj["a"]["b"]`` for ``"a.b"``; ``None`` where a level is absent."""
    cur = obj
    for key in dotted.split("."):
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


def to_length(value: Any, name: str, line: int, bad: BadRows, *, required: bool = True) -> int | None:
    """A token count from a JSON value: a whole, non-negative number."""
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise bad.row(line, MISSING, f"no {name}")
        return None
    x = _to_float(value, name, line, bad, UNPARSEABLE)
    if x != int(x):
        raise bad.row(line, UNPARSEABLE, f"{name} is {value!r}, not a whole number of tokens")
    if x < 0:
        raise bad.row(line, NEGATIVE, f"{name} is {value!r}")
    return int(x)


def to_hash_ids(value: Any, line: int, bad: BadRows) -> tuple[int, ...]:
    """Prefix-block ids (Mooncake's ``hash_ids``): a JSON list of non-negative integers
    that fit in int64."""
    if not isinstance(value, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < 2**63 for h in value
    ):
        raise bad.row(line, BAD_VALUE, "hash_ids must be a list of non-negative integers")
    return tuple(value)


def to_number(value: Any, name: str, line: int, bad: BadRows, reason: str = UNPARSEABLE) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise bad.row(line, MISSING, f"no {name}")
    return _to_float(value, name, line, bad, reason)


def _to_float(value: Any, name: str, line: int, bad: BadRows, reason: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise bad.row(line, reason, f"{name} is {_short(value)}")
    try:
        x = float(value)
    except (ValueError, OverflowError):
        raise bad.row(line, reason, f"{name} is {_short(value)}") from None
    if not math.isfinite(x) or abs(x) > 1e18:
        raise bad.row(line, reason, f"{name} is {_short(value)}")
    return x


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Clock:
    """Checks that timestamps never go backwards, row by row."""

    def __init__(self, bad: BadRows, name: str = "timestamp") -> None:
        self.bad = bad
        self.name = name
        self.last: float | None = None

    def check(self, t: float, line: int) -> float:
        if self.last is not None and t < self.last:
            raise self.bad.row(line, BACKWARDS, f"{self.name} {t:g} comes after {self.last:g}")
        self.last = t
        return t


class Collected:
    """Rows gathered one at a time by the JSON readers, turned into a :class:`Workload`."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.session: list[str | None] = []
        self.turn: list[int] = []
        self.hash_ids: list[tuple[int, ...]] = []

    def add(self, t: float, prompt: int, output: int, session: str | None = None, turn: int = 0,
            hash_ids: tuple[int, ...] = ()) -> None:
        self.t.append(t)
        self.prompt.append(prompt)
        self.output.append(output)
        self.session.append(session)
        self.turn.append(turn)
        self.hash_ids.append(hash_ids)

    def workload(self, path: str, bad: BadRows, *, block_tokens: int = 512, estimated: bool = False,
                 notes: tuple[str, ...] = (), rebase: bool = True, source: str | None = None,
                 keep_hash_ids: bool | None = None):

        if not self.t:
            raise InputError(
                f"no usable requests ({bad.skipped} bad rows skipped)" if bad.skipped else "no requests in the file",
                path=path,
            )
        t0 = self.t[0] if rebase else 0.0
        has_session = any(s is not None for s in self.session)
        has_hash = any(self.hash_ids) if keep_hash_ids is None else keep_hash_ids
        return Workload(
            arrival_s=[x - t0 for x in self.t],
            prompt_tokens=self.prompt,
            output_tokens=self.output,
            session=self.session if has_session else None,
            turn=self.turn if has_session else None,
            hash_ids=self.hash_ids if has_hash else None,
            block_tokens=block_tokens,
            source=source or path,
            estimated_tokens=estimated,
            notes=bad.notes() + tuple(notes),
        )


def iter_records(text: str, bad: BadRows) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` from a JSON array of objects (each with the line it starts on)
    or, when the text does not start with ``[``, from JSON lines."""
    stripped = text.lstrip()
    if not stripped.startswith("["):
        yield from iter_jsonl(text, bad)
        return
    decoder = json.JSONDecoder()
    pos = len(text) - len(stripped) + 1
    line, counted = 1, 0
    n = len(text)

    def skip_ws(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    def line_at(i: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, i)
        counted = i
        return line

    pos = skip_ws(pos)
    if pos < n and text[pos] == "]":
        return
    while True:
        pos = skip_ws(pos)
        start_line = line_at(pos)
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError) as err:
            where = err.lineno if isinstance(err, json.JSONDecodeError) else start_line
            raise bad.error(where, BAD_JSON, _json_reason(err) + " (cannot resume inside a JSON array)") from None
        if isinstance(obj, dict):
            yield start_line, obj
        else:
            try:
                raise bad.row(start_line, BAD_JSON, f"expected an object {{...}}, found {type(obj).__name__}")
            except SkipRow:
                pass
        pos = skip_ws(pos)
        if pos < n and text[pos] == ",":
            pos += 1
            continue
        if pos < n and text[pos] == "]":
            return
        raise bad.error(line_at(min(pos, n)), BAD_JSON, "expected ',' or ']' between array items")

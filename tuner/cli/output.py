"""How the commands print: rich tables that fit the terminal (80 columns and up) without
cutting a value, and JSON for scripts.

:func:`table` makes a table in the one look every command uses (a rule under the header,
no vertical bars: four columns of borders are 12 characters an 80-column terminal
needs). :func:`fit` then gives every value column the width of its widest cell and of
the longest word of its header, so that rich wraps the label columns (and header words
at spaces) rather than print ``26,…``; nothing is ever cut with an ellipsis."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def console(*, stderr: bool = False) -> Console:
    """A console as wide as the terminal (``COLUMNS`` when set), 80 when not a terminal."""
    from rich.console import Console

    return Console(stderr=stderr)


def table(title: str | None = None, *, header: bool = True) -> Table:
    from rich import box
    from rich.table import Table

    return Table(title=title, show_header=header, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
                 collapse_padding=True, show_edge=False)


def _cell_width(cell: Any) -> int:
    from rich.text import Text

    text = Text.from_markup(cell) if isinstance(cell, str) else cell
    return max((len(line) for line in text.plain.splitlines()), default=0) if isinstance(text, Text) else 0


def _longest_word(cell: Any) -> int:
    from rich.text import Text

    text = Text.from_markup(cell) if isinstance(cell, str) else cell
    return max((len(w) for w in text.plain.split()), default=0) if isinstance(text, Text) else 0


def fit(tbl: Table, out: Console, labels: Sequence[int] = (0,)) -> Table:
    """Keep the values of ``tbl`` whole on ``out``. When the table is wider than the
    terminal, every column but ``labels`` gets the width of its widest cell (its header
    wraps at spaces) and the label columns wrap at spaces; when even that does not fit,
    the values wrap too. No cell is cut: a word too long for its column folds."""
    from rich.measure import Measurement

    for column in tbl.columns:
        column.overflow = "fold"
    if Measurement.get(out, out.options.update_width(1 << 16), tbl).maximum <= out.width:
        return tbl
    values = [i for i in range(len(tbl.columns)) if i not in labels]
    need = {i: max([_longest_word(tbl.columns[i].header), *(_cell_width(c) for c in tbl.columns[i].cells)])
            for i in values}
    words = sum(max([_longest_word(tbl.columns[i].header), *(_longest_word(c) for c in tbl.columns[i].cells)])
                for i in labels if i < len(tbl.columns))
    if sum(need.values()) + words + 2 * len(tbl.columns) <= out.width:
        for i, width in need.items():
            tbl.columns[i].width = width
    return tbl


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (dates and other objects as strings)."""
    print(json.dumps(data, indent=2, default=str))


__all__ = ["console", "fit", "print_json", "table"]

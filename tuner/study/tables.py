"""What :mod:`tuner.study.analysis` returns: a study's table and what the whole table means,
in typed fields.

Each result is a small frozen object: ``frame`` is a plain :class:`pandas.DataFrame` (tuner
sets no ``DataFrame.attrs``: untyped strings, lost in a file and in a ``concat`` of frames
that differ), and the other fields say what only the whole table can say: the study, its
target, the trial it recommends, the capacity plan a sweep belongs to. What is true of one
row is a column.

* :class:`TrialsTable` — :func:`tuner.study.analysis.trials_frame`.
* :class:`TopGroups` — :func:`tuner.study.analysis.top_groups`.
* :class:`PlanSweep` — :func:`tuner.study.analysis.plan_sweep`.

A notebook cell that ends in one shows its table under a line of those facts; ``len()``
counts its rows; :meth:`Table.to_frame` gives a copy to change.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Table:
    """A table of one study: its rows in ``frame``."""

    frame: pd.DataFrame
    """The rows: a plain DataFrame, shared with this object (:meth:`to_frame` gives a copy)."""
    study: str
    """The name of the study the rows were read from."""

    def to_frame(self) -> pd.DataFrame:
        """A copy of :attr:`frame`, yours to change without changing this result."""
        return self.frame.copy()

    @property
    def empty(self) -> bool:
        """Whether the table has no rows."""
        return bool(self.frame.empty)

    def __len__(self) -> int:
        return len(self.frame)

    def describe(self) -> str:
        """One line: what the table is, of which study, and what the whole of it means."""
        return f"{type(self).__name__} of study {self.study!r}, {len(self)} rows"

    def __repr__(self) -> str:
        return f"{self.describe()}\n{self.frame!r}"

    def _repr_html_(self) -> str:
        table = self.frame._repr_html_()  # what a notebook shows for the frame itself
        return f"<p>{html.escape(self.describe())}</p>\n{table or html.escape(repr(self.frame))}"


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class TrialsTable(Table):
    """Every trial of a study, one row each (columns: :func:`tuner.study.analysis.trial_row`;
    ``recommended`` marks the recommended trial's row)."""

    target_ttft_s: float | None = None
    """The study's P95 TTFT target in seconds; ``None`` when the study does not record one."""
    recommended: int | None = None
    """The number of the trial the study recommends (:func:`tuner.study.analysis.recommendation`);
    ``None`` when no trial met the target."""

    def describe(self) -> str:
        target = "no target recorded" if self.target_ttft_s is None else f"target P95 TTFT {self.target_ttft_s:g} s"
        chosen = "nothing recommended" if self.recommended is None else f"trial {self.recommended} recommended"
        return f"{len(self)} trials of study {self.study!r}: {target}, {chosen}"


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class TopGroups(Table):
    """The best effective configurations of a study, one row each, by throughput (columns:
    :data:`tuner.study.analysis.GROUP_COLUMNS`, then one per knob)."""

    caveat: str | None = None
    """Why the configurations must be read with care (an endpoint study: tuner never applied
    them); ``None`` when there is nothing to say."""

    def describe(self) -> str:
        said = f"top {len(self)} configurations of study {self.study!r}"
        return said + (f" ({self.caveat})" if self.caveat else "")


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class PlanSweep(Table):
    """The load sweep of one capacity plan ``tuner plan`` stored in a study, one row per run
    (columns: :data:`tuner.study.analysis.SWEEP_COLUMNS`, and :data:`~tuner.study.analysis.SLO_COLUMNS`
    for a plan of several SLOs). Every plan field is ``None`` when the study holds no plan."""

    plan: str | None = None
    """Which plan, in words (``trial 6 at 0.3 s``); ``None``: the study holds no plan."""
    trial: int | None = None
    """The trial whose configuration the plan swept."""
    target_ttft_s: float | None = None
    """The plan's P95 TTFT target in seconds (a plan may be made at a target of its own)."""
    max_load: float | None = None
    """The most load meeting the target, on the sweep's axis (:attr:`load_kind`)."""
    bound: str | None = None
    """``interpolated`` (the target broke within the sweep) or ``at_least`` (it never broke:
    :attr:`max_load` is a lower bound)."""
    load_kind: str | None = None
    """``concurrency`` (users) or ``rate`` (requests/s)."""
    tokens_per_s: float | None = None
    """The throughput (input and output tokens/s) at :attr:`max_load`."""
    max_concurrency: float | None = None
    """Concurrent requests at :attr:`max_load` (Little's law for an open-loop sweep)."""
    slos: tuple[str, ...] = ()
    """For a plan of several SLOs, the set as typed, P95 TTFT first; empty when the plan held
    P95 TTFT alone."""

    @property
    def load_unit(self) -> str:
        """``users`` or ``requests/s``: the unit of ``level`` and :attr:`max_load`."""
        return "requests/s" if self.load_kind == "rate" else "users"

    def describe(self) -> str:
        if self.plan is None:
            return f"no capacity plan stored in study {self.study!r}"
        at_least = "at least " if self.bound == "at_least" else ""
        return (f"capacity plan of study {self.study!r} ({self.plan}): {at_least}{self.max_load:g} "
                f"{self.load_unit}, {len(self)} runs")


def as_frame(table: Any, argument: str = "frame") -> pd.DataFrame:
    """The DataFrame of ``table``: a :class:`Table`'s :attr:`~Table.frame`, or a DataFrame as
    it is (a filtered copy, say). :class:`~tuner.core.errors.InputError` names ``argument``
    for anything else."""
    import pandas as pd

    if isinstance(table, Table):
        return table.frame
    if isinstance(table, pd.DataFrame):
        return table
    raise InputError(f"{argument} must be a table of tuner.study.analysis or a pandas DataFrame, "
                     f"got {type(table).__name__}", argument=argument,
                     hint="pass analysis.trials_frame(study) or its .frame")


__all__ = ["PlanSweep", "Table", "TopGroups", "TrialsTable", "as_frame"]

"""How the commands show progress: a rich bar on stderr with the steps done, what runs
now, the time spent and the time left (ETA), as :class:`tuner.runtime.progress.Observer` hooks.

stdout is never touched, so ``--output json`` stays one JSON object; the bar is drawn only
when stderr is a terminal (:func:`shown`), else the observer is headless and only
warnings print, one line each."""
from __future__ import annotations

import sys
from typing import Any

from tuner.core.urls import redact
from tuner.runtime.progress import Observer
from tuner.serving.slo import value_text


def shown() -> bool:
    """Whether a bar is drawn: stderr is a terminal (not a pipe, a log file, a test)."""
    return sys.stderr.isatty()


def warn(text: str) -> None:
    """One line on stderr, as every tuner message (credentials masked)."""

    print(f"tuner: warning: {redact(text)}", file=sys.stderr, flush=True)


class Bar(Observer):
    """A progress bar of ``total`` ``unit`` (trials, runs) on stderr, with the phase and
    an ETA; with ``best`` the best value so far (search, nightly). Used as a context
    manager around the call it watches. ``total`` None: a spinner and the time spent."""

    def __init__(self, unit: str, total: int | None, *, enabled: bool | None = None, best: bool = False,
                 objective: str = "tokens") -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.table import Column

        def kept() -> Column:  # a column the terminal's width never cuts
            return Column(no_wrap=True)

        self.objective = objective
        # On a narrow terminal (80 columns) the bar and the phase give way, never the count, the best or the
        # times: rich cut "40/40" to "40/…" when every column kept its natural width.
        columns: list[Any] = [SpinnerColumn(table_column=kept()), TextColumn(unit, table_column=kept())]
        if total is not None:
            columns += [BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=5)),
                        MofNCompleteColumn(table_column=kept())]
        if best:
            columns.append(TextColumn("best {task.fields[best]}", table_column=kept()))
        columns += [TextColumn("[dim]{task.fields[phase]}", table_column=Column(ratio=2, no_wrap=True,
                                                                                 overflow="ellipsis")),
                    TimeElapsedColumn(table_column=kept())]
        if total is not None:
            columns += [TextColumn("left", table_column=kept()), TimeRemainingColumn(table_column=kept())]
        self.progress = Progress(*columns, console=Console(stderr=True), transient=False, expand=True,
                                 disable=not (shown() if enabled is None else enabled))
        #: every field a column renders, handed whole to rich on each change (:meth:`_set`)
        self.fields: dict[str, str] = {"best": "-", "phase": ""}
        self.task = self.progress.add_task(unit, total=total, **self.fields)

    def __enter__(self) -> Bar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def _set(self, *, reset: bool = False, **changes: Any) -> None:
        """The one way the task changes: rich's own arguments (``total``, ``completed``,
        ``advance``) go through, and the fields always go whole, so that no hook can leave a
        column without its field (rich's ``reset`` replaces the fields it is given, 15.0.0
        and before: passing one alone dropped ``best`` and the next redraw raised KeyError)."""
        unknown = set(changes) - set(self.fields) - {"total", "completed", "advance"}
        if unknown:
            raise TypeError(f"no column shows {sorted(unknown)}")
        self.fields.update({k: str(changes.pop(k)) for k in list(changes) if k in self.fields})
        if reset:
            self.progress.reset(self.task, **changes, **self.fields)
        else:
            self.progress.update(self.task, **changes, **self.fields)

    def step(self, phase: str = "") -> None:
        """One more unit done; the total grows when the work turns out longer."""
        task = self.progress.tasks[0]
        if task.total is not None and task.completed + 1 > task.total:
            self._set(total=task.completed + 1)
        self._set(advance=1, phase=phase)

    # tuner.runtime.progress.Observer hooks
    def on_start(self, name: str, finished: int, budget: int) -> None:
        # a resumed study starts part-way: a reset keeps the ETA to the speed seen from now on
        self._set(reset=True, total=budget, completed=min(finished, budget), phase=f"study {name}")

    def on_phase(self, text: str) -> None:
        self._set(phase=text)

    def on_trial(self, trial: Any, best: Any, finished: int) -> None:

        text = "-" if best is None else f"{value_text(best.value, self.objective)} (#{best.number})"
        total = self.progress.tasks[0].total
        self._set(completed=finished if total is None else min(finished, total), best=text, phase="")

    def on_warning(self, text: str) -> None:

        if self.progress.disable:
            warn(text)
        else:
            self.progress.console.print(f"tuner: warning: {redact(text)}", markup=False, highlight=False)


class Runs(Bar):
    """The load runs of ``tuner plan``: a step a ``... run at ...`` phase (sweep, extend,
    verify), the total the runs a sweep makes at least (its levels and one verify run a
    repeat), grown as extensions come."""

    def __init__(self, total: int, *, enabled: bool | None = None) -> None:
        super().__init__("runs", total, enabled=enabled)
        self.running = False

    def on_phase(self, text: str) -> None:
        if " run at " in text:
            if self.running:
                self.step(text)
                return
            self.running = True
        super().on_phase(text)

    def __exit__(self, *exc: object) -> None:
        if self.running and exc[0] is None:
            task = self.progress.tasks[0]
            self._set(total=task.completed + 1, completed=task.completed + 1, phase="done")
        super().__exit__(*exc)


__all__ = ["Bar", "Runs", "shown", "warn"]

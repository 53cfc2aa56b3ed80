"""How a long run tells its progress: one optional observer with ``on_*`` hooks.

Every long call (:func:`tuner.search`, :func:`tuner.plan`, nightly, calibration) takes
``observer=None``; ``None`` is headless (nothing is shown: what a warning says is also in
the result's notes). The CLI passes one that draws a progress bar; a notebook may pass its
own. :class:`Observer` does nothing: subclass it and override the hooks you show.
"""
from __future__ import annotations

from typing import Any


class Observer:
    """Progress hooks of a run; each does nothing here."""

    def on_start(self, name: str, finished: int, budget: int) -> None:
        """A study ``name`` starts (or resumes) with ``finished`` of ``budget`` trials done."""

    def on_phase(self, text: str) -> None:
        """What the run is doing now (``pre-check``, ``repeat 1: sweep run at 8 users``)."""

    def on_trial(self, trial: Any, best: Any, finished: int) -> None:
        """A trial ended (an Optuna FrozenTrial); ``best`` is the study's recommendation so far."""

    def on_warning(self, text: str) -> None:
        """Something the person running it should know, in one line."""


def observer_or_headless(observer: Observer | None) -> Observer:
    """``observer``, or one that shows nothing."""
    return observer if observer is not None else Observer()


__all__ = ["Observer", "observer_or_headless"]

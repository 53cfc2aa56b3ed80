"""How a study reports progress: the observer's hooks, and Optuna kept quiet."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

class SearchObserver:
    """Progress hooks; the default does nothing (headless)."""

    def on_start(self, name: str, finished: int, budget: int) -> None: ...

    def on_phase(self, text: str) -> None: ...

    def on_trial(self, trial: FrozenTrial, best: FrozenTrial | None, finished: int) -> None: ...

    def on_warning(self, text: str) -> None: ...


class quiet_optuna:
    """Optuna logs every failed trial with its traceback at WARNING; the search reports
    failures itself, in one line (``SearchObserver.on_warning``)."""

    def __enter__(self) -> None:
        import optuna

        self.level = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        import optuna

        optuna.logging.set_verbosity(self.level)

"""Optuna kept quiet while a study runs: the search reports failures itself, in one
line, through its observer (:class:`tuner.runtime.progress.Observer`)."""
from __future__ import annotations


class quiet_optuna:
    """Optuna logs every failed trial with its traceback at WARNING; the search reports
    failures itself, in one line (``Observer.on_warning``)."""

    def __enter__(self) -> None:
        import optuna

        self.level = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        import optuna

        optuna.logging.set_verbosity(self.level)

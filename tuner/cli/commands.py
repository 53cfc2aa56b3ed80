"""Which module of ``tuner.cli`` holds each command; importing the module registers its
commands on the app. Add one entry here per new command module.

``tuner CMD ...`` imports CMD's module alone: ``tuner sim-serve``, started once per trial,
does not pay for the others' imports; ``tuner --version`` imports none. Help, and a name that is no
command, import all."""
from __future__ import annotations

import importlib

#: command -> module of tuner.cli that registers it
MODULES = {
    "search": "search",        # tuner search
    "studies": "studies",      # tuner studies, tuner studies show
    "trace": "trace",          # tuner trace stats / convert
    "estimate": "estimate",    # tuner estimate
    "sim-serve": "serve",      # tuner sim-serve
    "plan": "plan",            # tuner plan
    "report": "report",        # tuner report
    "nightly": "nightly",      # tuner nightly
    "calibrate": "calibrate",  # tuner calibrate
    "doctor": "doctor",        # tuner doctor
    "export": "export",        # tuner export
}


def register(argv: list[str] | None = None) -> None:
    """Import the module of the command ``argv`` names (its first word that is no option),
    or every command module when it names none."""
    command = next((a for a in argv or [] if not a.startswith("-")), None)
    if command is None and "--version" in (argv or []):
        return  # the root's own flag: no command is needed to print it
    modules = [MODULES[command]] if command in MODULES else MODULES.values()
    for module in modules:
        importlib.import_module(f"tuner.cli.{module}")

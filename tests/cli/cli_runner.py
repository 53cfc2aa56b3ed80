"""``run_cli``: run ``tuner`` in-process and return its exit code and captured output
(shared by the CLI tests; pytest puts this folder on sys.path, there is no __init__.py)."""
from __future__ import annotations

from tuner.cli import main


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err

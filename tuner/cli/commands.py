"""Imports every command module so that each registers on the app.
Add one line here per new command module."""
from __future__ import annotations
from tuner.cli import search  # noqa: F401,E402  tuner search
from tuner.cli import studies  # noqa: F401,E402  tuner studies, tuner studies show
from tuner.cli import trace  # noqa: F401,E402  tuner trace stats / convert
from tuner.cli import estimate  # noqa: F401,E402  tuner estimate
from tuner.cli import serve  # noqa: F401,E402  tuner sim-serve
from tuner.cli import plan  # noqa: F401,E402  tuner plan
from tuner.cli import report  # noqa: F401,E402  tuner report
from tuner.cli import nightly  # noqa: F401,E402  tuner nightly
from tuner.cli import calibrate  # noqa: F401,E402  tuner calibrate
from tuner.cli import doctor  # noqa: F401,E402  tuner doctor
from tuner.cli import export  # noqa: F401,E402  tuner export

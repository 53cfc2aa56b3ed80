"""Fixtures shared across test folders."""
from __future__ import annotations

import pytest

from tuner.testing import processes


@pytest.fixture
def no_leftover_processes():
    """Every process a test starts must be gone when it ends (asked for with
    ``pytest.mark.usefixtures`` or by an autouse fixture of a folder's conftest)."""
    with processes.no_leftover_processes():
        yield

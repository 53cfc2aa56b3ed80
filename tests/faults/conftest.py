"""Fault tests run real tuner processes; none may leave a process behind."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _every_test_checks_leftover_processes(no_leftover_processes):
    yield

"""Tests for code that plugs into tuner: :class:`BackendContract`, the contract every
backend meets (the protocol of :mod:`tuner.search.backend`), as a pytest class to subclass.

This package imports pytest; pytest is no dependency of tuner (it comes with the ``test``
extra). Nothing in tuner imports this package: only test suites do, tuner's own
(``tests/backends/test_contract.py``) and those of backends written elsewhere::

    from tuner.testing import BackendContract

    class TestMyBackend(BackendContract):
        def make_backend(self):
            return MyBackend(url="http://localhost:30000")
"""
from __future__ import annotations

from tuner.testing.contract import BackendContract, contract_workload

__all__ = ["BackendContract", "contract_workload"]

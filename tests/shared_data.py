"""What a user's clone does not have: ``../shared`` beside the repository (the real traces the
project's own CI keeps there). A test that reads it asks :func:`need_shared` for the path: on a
clone without it the test skips and says why; where ``TUNER_REQUIRE_SHARED`` is set (``.ci/run``
sets it, since CI has ``../shared``) a missing file fails the test instead, so a skip can never
hide it there.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACES = SHARED / "traces"
AZURE_CONV = TRACES / "azure_llm_2023_conv" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES / "mooncake_fast25_synthetic" / "synthetic_trace.jsonl"


def need_shared(path: Path = TRACES) -> Path:
    """``path`` (under ``../shared``), or skip the test saying it is not beside this clone."""
    if path.exists():
        return path
    reason = f"needs {path} (../shared beside the repository; a plain clone does not have it)"
    if os.environ.get("TUNER_REQUIRE_SHARED"):
        pytest.fail(f"{reason}: TUNER_REQUIRE_SHARED is set, so this must not skip", pytrace=False)
    pytest.skip(reason)

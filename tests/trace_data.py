"""The real traces the tests read: the copies tuner ships in ``tuner/data/traces`` (sources and licences in
its README), so a plain clone runs every test that needs them."""
from __future__ import annotations

from tuner.calibrate.probes import TRACES, TRACES_DIR

AZURE_CONV = TRACES_DIR / TRACES["azure_llm_2023_conv"]
MOONCAKE = TRACES_DIR / TRACES["mooncake_fast25_synthetic"]

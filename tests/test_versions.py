"""One reading of vLLM versions for the planner, the launcher and the calibration profiles."""
from __future__ import annotations

import pytest

from tuner.core.errors import InputError
from tuner.core.versions import parse_version, same_version
from tuner.sim.calibration import find_profile
from tuner.sim.hardware import get_gpu
from tuner.sim.memory import uses_v1_engine


def test_short_and_decorated_versions_name_the_release():
    assert parse_version("0.26") == parse_version("0.26.0") == (0, 26, 0)
    assert parse_version("0.6.3.post1") == (0, 6, 3)
    assert same_version("0.26", "0.26.0") and not same_version("0.26.1", "0.26.0")
    assert not same_version("latest", "0.26.0")
    with pytest.raises(InputError, match="cannot read vLLM version"):
        parse_version("latest")


def test_the_shipped_h200_profile_is_found_for_0_26_as_for_0_26_0():
    full = find_profile("H200", "0.26.0")
    assert full is not None and full.endswith("h200-vllm-0.26.0/profile.yaml")
    assert find_profile("H200", "0.26") == full
    assert find_profile("H200", "0.25.0") is None


def test_the_planner_and_the_launcher_agree_on_the_engine_of_a_short_version():
    v100 = get_gpu("V100-32GB-SXM2")
    assert uses_v1_engine(v100, parse_version("0.10")) == uses_v1_engine(v100, parse_version("0.10.0"))

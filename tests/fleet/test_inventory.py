"""tuner.fleet.inventory: the fleet file, read with every bad value named at its file:line."""
from __future__ import annotations

import pytest

from tuner.core.errors import InputError
from tuner.fleet.inventory import SHIPPED_DIR, read_fleet

GOOD = """\
name: room
model: qwen2.5-7b
search: {budget: 4, requests: 200}
kinds:
  V100-32GB-SXM2: {count: 8, gpu_hour_cost: 0.15, vllm_version: "0.6.3"}
  old-l4:
    gpu: l4-24gb
    count: 2
    gpu_hour_cost: 0.7
  H100-SXM: {count: unlimited, gpu_hour_cost: 2.49}
"""


def test_a_fleet_file_reads_into_kinds(tmp_path):
    path = tmp_path / "room.yaml"
    path.write_text(GOOD)
    fleet = read_fleet(path)
    assert (fleet.name, fleet.model, fleet.budget, fleet.requests) == ("room", "qwen2.5-7b", 4, 200)
    v100, l4, h100 = fleet.kinds
    assert (v100.gpu, v100.count, v100.vllm_version, v100.max_tp) == ("V100-32GB-SXM2", 8, "0.6.3", 8)
    assert (l4.label, l4.gpu, l4.max_tp) == ("old-l4", "L4", 2)          # an alias resolves; max_tp defaults to the count  # noqa: E501
    assert (h100.count, h100.max_tp, h100.engines_available(1)) == (None, 8, None)
    assert v100.engines_available(2) == 4


def test_the_shipped_fleets_read_by_name():
    names = sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))
    assert {"article-004-room", "article-000-box", "mixed-room"} <= set(names)
    for name in names:
        assert read_fleet(name).kinds
    assert len(read_fleet("mixed-room").kinds) == 6


@pytest.mark.parametrize("edit, line, words", [
    (("count: 2", "count: two"), 8, "kinds.old-l4.count must be a number of GPUs"),
    (("gpu_hour_cost: 0.7", "gpu_hour_cost: -1"), 9, "gpu_hour_cost must be the price of one GPU-hour"),
    (('vllm_version: "0.6.3"', "vllm_version: 0.10"), 5, "vllm_version must be text"),
    (("gpu: l4-24gb", "gpu: L40-S"), 7, "L40-S"),
    (("search: {budget: 4", "search: {budgett: 4"), 3, "unknown key 'budgett'"),
    (("count: 8,", "count: 8, max_tp: 16,"), 5, "max_tp 16 is more than its 8 GPUs"),
    (("count: 8,", "count: 8, max_tp: 3,"), 5, "max_tp must be a power of two"),
    (("model: qwen2.5-7b", "model: qwen2.5-7b\nprice: 3"), 3, "unknown key 'price'"),
])
def test_bad_values_name_the_file_and_line(tmp_path, edit, line, words):
    path = tmp_path / "room.yaml"
    path.write_text(GOOD.replace(*edit))
    with pytest.raises(InputError) as err:
        read_fleet(path)
    assert f"{path}:{line}:" in str(err.value) and words in str(err.value)


def test_no_such_fleet_names_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="no fleet file 'nowhere'.*mixed-room"):
        read_fleet("nowhere")
    (tmp_path / "empty.yaml").write_text("kinds: {}\n")
    with pytest.raises(InputError, match="empty.yaml:1: kinds: must map GPU kinds"):
        read_fleet(tmp_path / "empty.yaml")

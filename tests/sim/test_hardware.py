from __future__ import annotations

import pytest

from tuner.core.errors import InputError
from tuner.sim.hardware import GiB, get_gpu, list_gpus

REQUIRED = ["V100-16GB-PCIE", "V100-32GB-SXM2", "T4", "A10", "L4", "L40S", "A100-40GB",
            "A100-80GB", "H100-SXM", "H200", "RTX-4090"]


def test_catalog_has_the_issue_gpus_with_sources():
    names = {g.name for g in list_gpus()}
    assert set(REQUIRED) <= names
    for gpu in list_gpus():
        assert "datasheet" in gpu.source.lower() or "whitepaper" in gpu.source.lower()


def test_capabilities_follow_compute_capability():
    v100, t4, l4, h100 = (get_gpu(n) for n in ("v100-16gb", "t4", "l4", "h100"))
    assert not v100.bf16 and not v100.fp8 and v100.cc == 70
    assert not t4.bf16 and t4.cc == 75
    assert l4.bf16 and l4.fp8
    assert h100.bf16 and h100.fp8 and h100.interconnect == "nvlink"
    assert get_gpu("V100-32GB").interconnect == "nvlink"
    assert get_gpu("v100-16gb").interconnect == "pcie"


def test_h200_memory_is_torch_total_not_nvidia_smi():
    # nvidia-smi on the lab's H200 shows 143771 MiB; torch reports 139.80 GiB total.
    h200 = get_gpu("H200")
    assert h200.memory_bytes < 143771 * 2**20
    assert h200.memory_bytes / GiB == pytest.approx(139.8, abs=0.01)


def test_lookup_is_case_insensitive_and_unknown_names_list_known_ones():
    assert get_gpu("h100-sxm").name == "H100-SXM"
    with pytest.raises(InputError) as err:
        get_gpu("B300")
    assert "H100-SXM" in str(err.value) and "TUNER_GPU_CATALOG" in str(err.value)


@pytest.mark.parametrize("family, members", [("A100", {"A100-40GB", "A100-80GB"}),
                                             ("v100", {"V100-16GB-PCIE", "V100-32GB-SXM2"})])
def test_a_family_name_with_several_memory_sizes_is_refused_with_the_choices(family, members):
    """--gpu A100 once meant A100-80GB silently: a 40 GB card got a KV cache twice its size."""
    with pytest.raises(InputError) as err:
        get_gpu(family)
    assert "several" in str(err.value) and all(m in str(err.value) for m in members)
    assert {get_gpu(m).name for m in members} == members  # the full names still work
    assert get_gpu("h100").name == "H100-SXM"  # one entry: the family name is unambiguous


def test_user_catalog_adds_a_gpu(tmp_path, monkeypatch):
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "MI-FAKE:\n  memory_gib: 10\n  hbm_bandwidth_gbs: 500\n  fp16_tflops: 50\n"
        "  int8_tops: null\n  compute_capability: '8.0'\n  interconnect: pcie\n"
        "  link_bandwidth_gbs: 32\n  pcie_gen: 4\n  source: my own measurements\n"
    )
    monkeypatch.setenv("TUNER_GPU_CATALOG", str(path))
    gpu = get_gpu("mi-fake")
    assert gpu.memory_bytes == 10 * GiB and gpu.bf16 and not gpu.fp8
    assert any(g.name == "H200" for g in list_gpus())


def test_user_catalog_errors_name_file_and_key(tmp_path, monkeypatch):
    path = tmp_path / "gpus.yaml"
    path.write_text("BAD:\n  memory_gib: -3\n  hbm_bandwidth_gbs: 500\n  fp16_tflops: 50\n"
                    "  compute_capability: '8.0'\n  interconnect: pcie\n  link_bandwidth_gbs: 32\n"
                    "  pcie_gen: 4\n  source: x\n")
    monkeypatch.setenv("TUNER_GPU_CATALOG", str(path))
    with pytest.raises(InputError) as err:
        get_gpu("BAD")
    assert str(path) in str(err.value) and "BAD.memory_gib" in str(err.value)
    path.write_text("BAD:\n  memory_gib: 3\n")
    with pytest.raises(InputError) as err:
        list_gpus()
    assert str(path) in str(err.value) and "hbm_bandwidth_gbs" in str(err.value)
    path.write_text("BAD: [unclosed\n")
    with pytest.raises(InputError) as err:
        list_gpus()
    assert str(path) in str(err.value)

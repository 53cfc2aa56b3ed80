"""Calibration profiles and GPU catalogs written by hand: a problem is one line naming the
file and the line of the key at fault; a profile named explicitly reports every section."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from tuner.core.errors import InputError, TunerWarning
from tuner.sim.calibration import find_profile, load_calibration, memory_overrides
from tuner.sim.hardware import get_gpu, load_catalog

H200 = get_gpu("H200")


def _refused(call, *args) -> InputError:
    with pytest.raises(InputError) as info:
        call(*args)
    assert "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("hbm_efficiency: {value: .nan, source: x}\n", 1, "must be in (0, 1]"),
        ("link_efficiency: 0.7\nstep_overhead_s: {value: 25, source: x}\n", 2, "0-10 s"),
        ("step_overhead_s: fast\n", 1, "must be in 0-10 s"),
        ("launch_per_layer_s:\n  value:\n    graph: 0.1\n    grpah: 0.2\n", 4, "unknown launch mode 'grpah'"),
        ("launch_per_layer_s:\n  value: {graph: x}\n", 2, "launch_per_layer_s.graph"),
        ("calibrated: 'no'\n", 1, "true or false"),
        ("memory:\n  non_torch_bytes: lots\n", 2, "memory.non_torch_bytes must be a number"),
        ("memory:\n  7: 1\n", 2, "memory: a key must be a name"),
        ("memory:\n  weight_overhead_by_model: {qwen2.5-7b: -1}\n", 2,
         "memory.weight_overhead_by_model must map model names to bytes"),
        ("memory:\n  weight_overhead_by_model: 112537641\n", 2, "must map model names to bytes"),
        ("memory: [1, 2]\n", 1, "memory must be a mapping"),
        ("match:\n  gpu: H200\n  vllm_version: 0.26\n", 3, "quote versions"),
        ("link_efficiency: 0.7\nlink_efficiency: 0.8\n", 2, "given twice"),
        ("hbm_efficiency: \xe9\x00\n", 1, "not valid YAML"),
    ],
)
def test_a_named_profile_reports_each_problem_at_its_line(tmp_path, text, line, words):
    profile = tmp_path / "profile.yaml"
    profile.write_text(text)
    err = _refused(load_calibration, H200, str(profile))
    assert (err.path, err.line) == (str(profile), line) and words in str(err)


def test_a_named_profiles_memory_section_does_not_vanish(tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text("memory:\n  cudagraph_kv_fraction: 2\n")
    err = _refused(memory_overrides, "H200", "0.26.0", str(profile))
    assert err.line == 2 and "0-1" in str(err)
    profile.write_bytes(b"memory: {non_torch_bytes: 1}\nnotes: \xff\n")
    assert _refused(memory_overrides, "H200", "0.26.0", str(profile)).line == 2


def test_a_profile_keeps_each_shapes_load_overhead(tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text("memory:\n  weight_overhead_bytes: 100\n  weight_overhead_by_model: {llama-3.1-8b: 40}\n")
    assert memory_overrides("H200", "0.26.0", str(profile)) == {
        "weight_overhead_bytes": 100.0, "weight_overhead_by_model": {"llama-3.1-8b": 40.0}}


def test_finding_profiles_passes_over_broken_ones(tmp_path, monkeypatch):
    for name, data in [("junk", b"\xff\xfe\x00"), ("list", b"- 1\n"), ("match", b"match: [H200]\n"),
                       ("deep", b"match: " + b"[" * 500 + b"\n")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "profile.yaml").write_bytes(data)
    (tmp_path / "nomatch").mkdir()  # a profile without a match section is no profile for a GPU: not broken
    (tmp_path / "nomatch" / "profile.yaml").write_text("memory: {weight_overhead_bytes: 1}\n")
    monkeypatch.setenv("TUNER_CALIBRATION_DIR", str(tmp_path))
    with pytest.warns(TunerWarning) as said:
        assert find_profile("H200", "0.26.0").endswith("h200-vllm-0.26.0/profile.yaml")  # the shipped one
    lines = sorted(str(w.message) for w in said)
    # each broken one is said once, on one line, with its file (and line where YAML has one)
    assert len(lines) == 4 and all("\n" not in m for m in lines)
    assert [m.split(str(tmp_path) + "/")[1].split("/")[0] for m in lines] == ["deep", "junk", "list", "match"]
    assert any("match/profile.yaml:1: match must be a mapping" in m for m in lines)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same files again: nothing said twice
        assert find_profile("H200", "0.26.0").endswith("h200-vllm-0.26.0/profile.yaml")


def test_a_broken_profile_is_one_warning_line_from_the_command(tmp_path):
    """From the command line, the file passed over is one line (tuner: warning: ...),
    and the command goes on with the shipped profile."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "profile.yaml").write_text("match:\n  gpu: 'H200\n  vllm_version: 0.26.0\n")
    env = {**os.environ, "TUNER_CALIBRATION_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "tuner", "estimate", "--model", "qwen2.5-7b", "--gpu", "H200",
                          "--vllm-version", "0.26.0"], capture_output=True, text=True, env=env, timeout=300)
    warned = [ln for ln in out.stderr.splitlines() if "passing over" in ln]
    assert out.returncode == 0, out.stderr
    assert warned == [ln for ln in warned if ln.startswith(f"tuner: warning: passing over calibration profile "
                                                          f"{tmp_path}/mine/profile.yaml:")]
    assert len(warned) == 1 and "not valid YAML" in warned[0]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("memory_gib: .nan", "memory_gib must be a number in (0, 16384]"),
        ("memory_gib: 80000000", "(0, 16384]"),
        ("hbm_bandwidth_gbs: .inf", "hbm_bandwidth_gbs"),
        ("compute_capability: a.b", "compute_capability"),
        ("pcie_gen: true", "pcie_gen must be an integer 1-7"),
        ("fp8: 'yes'", "fp8 must be true or false"),
        ("aliases: [[x]]", "aliases must be a list of names"),
        ("colour: red", "unknown key(s) 'colour'"),
        ("source: again", "given twice"),
    ],
)
def test_a_user_catalog_reports_each_problem_at_its_line(tmp_path, entry, words):
    good = {"memory_gib": 80, "hbm_bandwidth_gbs": 3350, "fp16_tflops": 990, "compute_capability": '"9.0"',
            "interconnect": "nvlink", "link_bandwidth_gbs": 450, "pcie_gen": 5, "source": "datasheet"}
    key = entry.split(":")[0]
    body = [f"  {k}: {v}\n" for k, v in good.items() if k != key or key == "source"]
    path = tmp_path / "gpus.yaml"
    path.write_text("MY-GPU:\n" + "".join(body) + f"  {entry}\n")
    err = _refused(load_catalog, path)
    assert (err.path, err.line) == (str(path), len(body) + 2) and words in str(err)


def test_a_user_catalog_that_is_not_a_mapping_names_its_file(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text("- H100\n")
    assert str(_refused(load_catalog, path)).startswith(f"{path}:1: GPU catalog must be a mapping")
    path.write_bytes(b"\xff")
    assert str(_refused(load_catalog, path)).startswith(f"{path}:1: not UTF-8 text")

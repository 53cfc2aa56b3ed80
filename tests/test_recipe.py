"""The winner as a serve-params file (tuner.search.recipe): what vllm bench sweep --serve-params
makes of it is the vllm serve command tuner prints, and knobs that change answers are noted."""
from __future__ import annotations

import json
import shlex

import pytest
import yaml

from tuner.core.errors import InputError
from tuner.search import serve_command
from tuner.search.recipe import output_notes, serve_params, write_recipe
from tuner.serving.config import Deployment, ServeConfig

DEP = Deployment(model="qwen2.5-7b", gpu="H100-SXM", gpu_count=2)
CONFIG = ServeConfig(max_num_seqs=256, max_num_batched_tokens=8192, gpu_memory_utilization=0.9,
                     enable_prefix_caching=False, enforce_eager=True, kv_cache_dtype="fp8", replicas=2)


def _as_vllm_bench_sweep_applies_it(params: dict) -> list[str]:
    """vllm/benchmarks/sweep/param_sweep.py's rule: key → --key-with-dashes, true → --key,
    false → --no-key, anything else → --key str(value); _benchmark_name is no flag."""
    argv: list[str] = []
    for key, value in params.items():
        if key == "_benchmark_name":
            continue
        flag = key.replace("_", "-")
        argv += [f"--{flag}" if value else f"--no-{flag}"] if isinstance(value, bool) else [f"--{flag}", str(value)]
    return argv


def test_the_params_give_back_the_serve_command_flags():
    params = serve_params(DEP, CONFIG)
    assert params["max_num_seqs"] == 256 and params["gpu_memory_utilization"] == 0.9
    assert params["enable_prefix_caching"] is False and params["enforce_eager"] is True
    assert params["kv_cache_dtype"] == "fp8" and params["data_parallel_size"] == 2
    command = shlex.split(serve_command(DEP, CONFIG))
    assert sorted(_as_vllm_bench_sweep_applies_it(params)) == sorted(command[3:])


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_json_and_yaml_hold_the_same_list_and_the_command_lies_beside(tmp_path, suffix):
    paths = write_recipe(tmp_path / f"win{suffix}", DEP, CONFIG, name="study.trial8", header=["trial 8"])
    assert [p.name for p in paths] == [f"win{suffix}", "win.sh"]
    text = paths[0].read_text()
    entries = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    assert entries == [{"_benchmark_name": "study.trial8", **serve_params(DEP, CONFIG)}]
    script = paths[1].read_text().splitlines()
    assert script[-1] == serve_command(DEP, CONFIG)
    assert any(line.startswith("# note: --kv-cache-dtype fp8") for line in script)
    if suffix == ".yaml":
        assert "# note: --kv-cache-dtype fp8" in text and serve_command(DEP, CONFIG) in text


def test_a_note_only_where_a_knob_changes_answers():
    assert output_notes(DEP, ServeConfig()) == []
    assert len(output_notes(DEP, CONFIG)) == 1 and "accuracy" in output_notes(DEP, CONFIG)[0]
    awq = Deployment(model="qwen2.5-7b", quantization="awq")
    assert [n.split(":")[0] for n in output_notes(awq, ServeConfig())] == ["--quantization awq"]


def test_an_unknown_extension_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(InputError, match=r"--recipe .*win\.txt: cannot tell the format"):
        write_recipe(tmp_path / "win.txt", DEP, CONFIG, name="x")
    assert list(tmp_path.iterdir()) == []

"""The knob table (tuner.core.knobs) and its readers agree: every row is a ServeConfig field with a
simulator hook, every knob has its option on the commands that take knobs, and a configuration
rendered as ``vllm serve`` flags reads back the same through sim-serve's parser."""
from __future__ import annotations

import dataclasses
import importlib

import pytest
import typer.main

from tuner.backends.vllm_args import render_flags
from tuner.cli import _register, app
from tuner.core.errors import InputError
from tuner.core.knobs import BY_NAME, KNOBS, Knob, knob
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.command import build_parser

LAYOUT = {"tensor_parallel_size", "replicas"}


def test_every_knob_is_a_serve_config_field_and_every_field_a_knob():
    fields = {f.name: f for f in dataclasses.fields(ServeConfig)}
    assert {k.name for k in KNOBS} == set(fields) - LAYOUT
    for k in KNOBS:  # a field left at its default renders no flag but a switch's own
        assert k.render(fields[k.name].default, "0.26.0") == ([f"--{k.flag}"] if fields[k.name].default is True else [])


@pytest.mark.parametrize("row", KNOBS, ids=lambda k: k.name)
def test_each_knob_names_the_simulator_hook_that_applies_it(row):
    module, name = row.sim.split(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_a_flag_is_rendered_only_for_the_vllm_lines_that_have_it():
    new = Knob("long_prefill_token_threshold", int, "long-prefill-token-threshold", "help", sim="m:f", since="0.8")
    assert new.render(None, "0.6.3") == []  # unset: nothing to refuse
    assert new.render(512, "0.8.0") == ["--long-prefill-token-threshold", "512"]
    with pytest.raises(InputError, match="vLLM 0.6.3 has no --long-prefill-token-threshold"):
        new.render(512, "0.6.3")
    prefix = knob("enable_prefix_caching")
    assert prefix.render(False, "0.6.3") == []  # the 0.6 line cannot say "off" (it is its default)
    assert prefix.render(False, "0.7.0") == ["--no-enable-prefix-caching"]


def test_the_simulator_refuses_a_knob_its_vllm_line_does_not_have(monkeypatch):
    import tuner.sim.memory.planner as planner

    late = dataclasses.replace(knob("max_num_batched_tokens"), since="0.7")  # as if it came in 0.7
    monkeypatch.setattr(planner, "KNOBS", tuple(late if k.name == late.name else k for k in KNOBS))
    old = Deployment(vllm_version="0.6.3")
    assert planner.plan_memory(old, ServeConfig()).num_gpu_blocks > 0  # unset: vLLM's default, nothing to refuse
    with pytest.raises(InputError, match="vLLM 0.6.3 has no --max-num-batched-tokens"):
        planner.plan_memory(old, ServeConfig(max_num_batched_tokens=4096))
    assert planner.plan_memory(Deployment(vllm_version="0.26.0"), ServeConfig(max_num_batched_tokens=4096))


@pytest.mark.parametrize("command", ["search", "estimate", "plan"])
def test_every_knob_has_its_flag_on_the_commands_that_take_knobs(command):
    _register()
    params = typer.main.get_command(app).commands[command].params
    flags = {opt for p in params for opt in (*p.opts, *p.secondary_opts)}
    missing = [k.flag for k in KNOBS if f"--{k.flag}" not in flags]
    assert not missing, f"tuner {command} has no option for {missing}"
    switches = [k.flag for k in KNOBS if k.type is bool and f"--no-{k.flag}" not in flags]
    assert not switches, f"tuner {command} cannot turn off {switches}"


@pytest.mark.parametrize("version", ["0.6.3", "0.26.0"])
def test_every_knob_set_for_vllm_reads_back_the_same_through_sim_serve(version):
    config = ServeConfig(gpu_memory_utilization=0.85, max_num_seqs=64, max_model_len=4096, block_size=32,
                         max_num_batched_tokens=2048, enable_prefix_caching=True, enforce_eager=True,
                         kv_cache_dtype="fp8")
    args = build_parser().parse_args(["qwen2.5-7b", *render_flags(Deployment(), config, version,
                                                                  host="127.0.0.1", port=8000)])
    assert {k.name: getattr(args, k.name) for k in KNOBS} == {k.name: getattr(config, k.name) for k in KNOBS}


def test_a_knob_only_some_vllm_lines_have_is_written_only_when_set():
    """A configuration written before tuner knew a knob reads and writes the same after (its
    key, the copies and twins found by it, a resumed study's trials)."""
    late = [k.name for k in KNOBS if k.since is not None]
    assert late  # long_prefill_token_threshold (vLLM 0.7.2), api_server_count (0.9.0), enable_chunked_prefill
    unset = ServeConfig(max_num_seqs=64)
    assert not set(late) & set(unset.to_dict()) and ServeConfig.from_dict(unset.to_dict()) == unset
    values = {name: False if BY_NAME[name].type is bool else min(2048, BY_NAME[name].high) for name in late}
    given = ServeConfig(max_num_seqs=64, **values)
    assert all(given.to_dict()[name] == values[name] for name in late) and ServeConfig.from_dict(given.to_dict()) == given  # noqa: E501

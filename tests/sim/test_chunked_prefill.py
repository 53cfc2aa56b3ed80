"""--enable-chunked-prefill (vLLM's default: on), its one simulator effect and its refusal: with it off,
vLLM's V1 scheduler admits a waiting request only when its whole prompt fits the step's remaining token
budget (v1/core/sched/scheduler.py stops admitting for the step), and refuses a budget under max_model_len."""
from __future__ import annotations

import math

import pytest

from tuner.backends.vllm_args import render_flags
from tuner.core.errors import ConfigRejected
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.memory import plan_memory
from tuner.sim.scheduler import EngineCore

BASE = plan_memory(Deployment(model="qwen2.5-7b", gpu="H100-SXM"), ServeConfig(max_model_len=4096))


def steps_to_first_token(chunked: bool) -> int:
    """Budget 16. A (4-token prompt, 5 tokens out) is decoding when B (16-token prompt) arrives;
    the engine steps until B's first token."""
    plan = BASE.replace(block_size=4, num_gpu_blocks=200, max_num_batched_tokens=16, max_num_seqs=8,
                        enable_prefix_caching=False, enable_chunked_prefill=chunked)
    core = EngineCore(plan)
    core.add_request("A", 4, 5)
    core.step()                      # A's prompt, and its first token
    core.add_request("B", 16, 2)
    steps = 0
    while math.isnan(core.requests.t_first[1]):
        core.step()
        steps += 1
    return steps


def test_off_a_prompt_waits_for_a_step_with_room_for_all_of_it():
    # on: A decodes 1 token and B gets 15 of its 16 (step 1), then its last token (step 2: first token);
    # off: B's 16 never fit beside A's decode (15 left), so B waits for A's 4 decodes to end (steps 1-4)
    # and is prefilled whole in step 5
    assert steps_to_first_token(chunked=True) == 2
    assert steps_to_first_token(chunked=False) == 5


def test_off_a_token_budget_under_max_model_len_is_refused_and_the_default_budget_holds_it():
    dep = Deployment(model="qwen2.5-7b", gpu="H100-SXM")
    refused = r"max_num_batched_tokens \(2048\) is smaller than max_model_len \(16384\)"
    with pytest.raises(ConfigRejected, match=refused):
        plan_memory(dep, ServeConfig(max_model_len=16384, max_num_batched_tokens=2048, enable_chunked_prefill=False))
    plan_memory(dep, ServeConfig(max_model_len=16384, max_num_batched_tokens=2048))  # unset (on): chunks fit any budget
    off = plan_memory(dep, ServeConfig(max_model_len=16384, enable_chunked_prefill=False))
    assert off.config.max_num_batched_tokens == 16384  # vLLM's default budget grows to a whole prompt


def flags(config: ServeConfig, version: str) -> str:
    return " ".join(render_flags(Deployment(), config, version, host="127.0.0.1", port=8000))


def test_the_command_line_says_off_only_where_the_version_can():
    off = ServeConfig(enable_chunked_prefill=False)
    assert "--no-enable-chunked-prefill" in flags(off, "0.26.0")
    assert "chunked" not in flags(ServeConfig(), "0.26.0")  # the default: no flag, vLLM's own
    assert "chunked" not in flags(off, "0.6.3")  # a line that cannot spell off

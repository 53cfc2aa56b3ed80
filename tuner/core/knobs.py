"""vLLM's serving knobs, one row each (:data:`KNOBS`): the knob's name (a
:class:`~tuner.serving.config.ServeConfig` field, a space file's key, ``--set``'s name), its Python
type and range or choices, ``vllm serve``'s flag and the vLLM lines that have it (and, for a
switch, those that spell "off"), what it does, and the simulator's hook that applies it.

Read from here: ServeConfig's ranges and choices (:mod:`tuner.serving.config`), the knobs a space may
vary and their typing (:mod:`tuner.space`), the knob options and ``--set`` of ``tuner search``,
``estimate`` and ``plan`` (:mod:`tuner.cli._knobs`), ``tuner sim-serve``'s flags
(:mod:`tuner.sim.command`), the ``vllm serve`` command line (:mod:`tuner.backends.vllm_args`)
and the simulator's refusal of a flag the vLLM line lacks (:func:`tuner.sim.memory.plan_memory`).
Adding a knob is a row here, a ServeConfig field, and its effect in the simulator (the hook).

vLLM's default for an unset knob depends on the version, GPU and model; the simulator's hook
resolves it (``None`` renders no flag, so real vLLM picks its own).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.core.errors import InputError
from tuner.core.versions import parse_version

# The ranges tuner plans for. A value outside them is a typo (an extra zero, bytes where
# tokens belong) that would otherwise cost minutes or gigabytes before the first trial.
#: max_model_len and max_num_batched_tokens: the longest context any current model
#: advertises (10M tokens); vLLM refuses a longer max_model_len than the model's own.
MAX_TOKENS = 10_000_000
#: max_num_seqs: 64x vLLM's largest default (1024); a batch never gets near it.
MAX_NUM_SEQS = 65_536
#: block_size in tokens: vLLM's --block-size choices stop at a few hundred.
MAX_BLOCK_SIZE = 1024
#: api_server_count: one process (and a CPU core) each; no host has more cores than this.
MAX_API_SERVERS = 256


@dataclass(frozen=True, slots=True)
class Knob:
    """One ``vllm serve`` knob. ``unset``: the value that renders no flag (vLLM's own default
    then); ``high``: the largest whole number tuner plans for (int knobs, from 1); ``since``:
    the first vLLM line with the flag (None: every line tuner follows); ``negatable_since``:
    for a switch, the first line that takes ``--no-<flag>`` (before it "off" cannot be
    spelled, and is left out); ``sim``: the simulator's function that applies it
    (``module:function``)."""

    name: str
    type: type
    flag: str
    help: str
    sim: str
    unset: Any = None
    high: int | None = None
    choices: tuple[Any, ...] = ()
    since: str | None = None
    negatable_since: str | None = None
    headroom: float | None = None

    def render(self, value: Any, version: str) -> list[str]:
        """``vllm serve``'s arguments for ``value`` under vLLM ``version``: none for ``unset``
        (and for "off" where the line cannot spell it); InputError where the line has no flag."""
        self.check(value, version)
        if self.type is not bool:
            if value is None or value == self.unset:
                return []
            return [f"--{self.flag}", f"{value:g}" if isinstance(value, float) else str(value)]
        if value is None:  # vLLM's own default: no flag
            return []
        if value:
            return [f"--{self.flag}"]
        negatable = self.negatable_since is not None and parse_version(version) >= parse_version(self.negatable_since)
        return [f"--no-{self.flag}"] if negatable else []

    def check(self, value: Any, version: str) -> None:
        """InputError when ``value`` is set (not ``unset``, a switch on) and vLLM ``version``
        has no flag for it."""
        given = bool(value) if self.type is bool else value is not None and value != self.unset
        if given and self.since is not None and parse_version(version) < parse_version(self.since):
            raise InputError(f"vLLM {version} has no --{self.flag} (it came in {self.since})",
                             hint=f"leave {self.name} unset, or use vLLM {self.since} or newer")


#: Every knob tuner sets, in the order ``vllm serve``'s command line and a space's listing take them.
KNOBS: tuple[Knob, ...] = (
    Knob("gpu_memory_utilization", float, "gpu-memory-utilization",
         "Fraction of TOTAL GPU memory vLLM may use, e.g. 0.9. Default: the version's (0.92 now, 0.9 in older lines).",
         sim="tuner.sim.memory.defaults:default_gpu_memory_utilization", headroom=1.0),
    Knob("max_num_seqs", int, "max-num-seqs",
         "Most requests running at once per replica, e.g. 256. Default by GPU memory (256, or 1024 on H100/H200).",
         sim="tuner.sim.memory.defaults:default_batch_limits", high=MAX_NUM_SEQS, headroom=1e9),
    Knob("max_model_len", int, "max-model-len",
         "Longest prompt+output in tokens, e.g. 8192. Default: the model's max_position_embeddings.",
         sim="tuner.sim.memory.planner:plan_memory", high=MAX_TOKENS),
    Knob("block_size", int, "block-size",
         "KV-cache block in tokens, e.g. 16 (V1 backends need a multiple of 16).",
         sim="tuner.sim.memory.support:check_block_size", high=MAX_BLOCK_SIZE),
    Knob("max_num_batched_tokens", int, "max-num-batched-tokens",
         "Token budget per step, shared by decodes and prefill chunks, e.g. 8192. Default by GPU memory "
         "(2048 or 8192).",
         sim="tuner.sim.memory.defaults:default_batch_limits", high=MAX_TOKENS),
    Knob("long_prefill_token_threshold", int, "long-prefill-token-threshold",
         "Most prompt tokens one request may prefill in a step, e.g. 2048: a long prompt is cut into chunks "
         "of this size so short requests beside it start sooner (vLLM's default 0: no cap).",
         sim="tuner.sim.scheduler.policy:prefill_chunk", high=MAX_TOKENS, since="0.7.2"),
    # vLLM's V1 scheduler: with chunked prefill off, a waiting request whose prompt does not fit the step's
    # token budget stops admission for that step (v1/core/sched/scheduler.py: "If chunked_prefill is disabled,
    # we can stop the scheduling here"), and a budget under max_model_len is refused (config/scheduler.py)
    Knob("enable_chunked_prefill", bool, "enable-chunked-prefill",
         "Split long prompts across steps, beside decodes (vLLM's default: on). Off: a prompt is prefilled "
         "in one step, so max-num-batched-tokens must hold max-model-len.",
         sim="tuner.sim.scheduler.policy:Scheduler", since="0.4.1", negatable_since="0.8.5"),
    Knob("enable_prefix_caching", bool, "enable-prefix-caching",
         "Reuse KV of shared prompt prefixes (vLLM's default: on).",
         sim="tuner.sim.kvcache:BlockPool", negatable_since="0.7"),
    Knob("enforce_eager", bool, "enforce-eager",
         "No CUDA graphs: more KV memory, slower decode steps.",
         sim="tuner.sim.memory.empirical:activation_tokens", unset=False, headroom=0),
    Knob("kv_cache_dtype", str, "kv-cache-dtype",
         "auto (the model's dtype) or fp8 (half the KV bytes, twice the blocks; changes model outputs slightly), "
         "e.g. --kv-cache-dtype fp8.",
         sim="tuner.sim.memory.planner:plan_memory", unset="auto", choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
    # vLLM PR #17546 (May 2025, vLLM 0.9.0): "a new --api-server-count arg to vllm serve can be used to
    # specify an arbitrary number of API servers to run"; RFC #12705: "the API server runs in a single
    # process, utilizing a single CPU"
    Knob("api_server_count", int, "api-server-count",
         "API server processes in front of the engine, e.g. 4 (vLLM's default 1): each takes in and streams its "
         "share of the requests (detokenise, frame, send), so a few lift the cap one process puts on tokens/s "
         "at high concurrency; each needs a free CPU core.",
         sim="tuner.sim.scheduler.frontend:FrontEnd", high=MAX_API_SERVERS, since="0.9.0", headroom=1),
)

#: Each knob by its name.
BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}


def knob(name: str) -> Knob:
    """The row of knob ``name``."""
    return BY_NAME[name]

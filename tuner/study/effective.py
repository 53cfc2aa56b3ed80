"""Which knobs of a trial's configuration could not change its throughput on the study's
workload, and the configuration with those knobs folded: what the top trials are grouped by.

* :func:`no_effect` — knob -> one line saying why it had no effect here.
* :func:`effective_config` — the configuration with those knobs replaced by :data:`ANY`.
* :func:`group_key` — equal for two trials exactly when their effective configurations are.
* :func:`trial_group` — both, from a :class:`~tuner.study.record.TrialRecord`.
* :func:`caveat` — a line about the whole study when its configurations were never applied.

Each rule rests on vLLM's scheduler (cited beside it) and on facts ``tuner search`` records
in each trial's ``run``: the backend, the vLLM version and GPU (``hardware``), the longest
request, whether requests share prefixes, the loads it replayed and the backend's
capabilities (``restarts``: the server was started with the configuration). A fact not
recorded (a study written before tuner recorded it), a version or GPU not known, or a
backend that does not start the configuration folds nothing; the V0 engine folds only
max_num_seqs. No rule looks at the backend's name (but a study recorded before the
capabilities were, which has nothing else).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuner.core.errors import TunerError
from tuner.core.values import is_int, is_number
from tuner.core.versions import parse_version
from tuner.sim.hardware import get_gpu
from tuner.sim.memory import uses_v1_engine

if TYPE_CHECKING:
    from tuner.study.record import TrialRecord

#: What a folded knob reads in :func:`effective_config`.
ANY = "any"
#: Backends that start vLLM (or its simulator) with the trial's configuration.
APPLIED = ("sim", "vllm")
#: The default max_num_seqs of ``vllm serve`` is 256 or 1024 (engine/arg_utils.py
#: ``get_batch_defaults``), and the largest default token budget 16384 (>= 160 GiB GPUs;
#: tuner never passes --performance-mode, which doubles it): vllm-facts.md section 2.
DEFAULT_SEQS_MIN = 256
DEFAULT_BUDGET_MAX = 16384
#: The peak KV cache usage at the scored load under which gpu-memory-utilization is folded:
#: the loads above it the search tried (a few users more) cannot fill the rest, and the
#: polled peak may miss a short spike.
KV_SPARE = 0.25


def _engine(run: Mapping[str, Any]) -> str | None:
    """``"v1"`` or ``"v0"``: the vLLM engine the trial ran; None when that is not known."""

    version, gpu = run.get("vllm_version"), (run.get("hardware") or {}).get("gpu")
    if not version or not gpu:
        return None
    try:  # V0 before 0.8, and before 0.10.2 below compute capability 8.0 (tuner.sim.memory)
        return "v1" if uses_v1_engine(get_gpu(str(gpu)), parse_version(str(version))) else "v0"
    except TunerError:  # "sim", "dev", a GPU outside the catalog
        return None


def _max_num_seqs(config: Mapping[str, Any], run: Mapping[str, Any], levels: Sequence[float] | None,
                  failing: float | None) -> str | None:
    # max-num-seqs caps the requests running at once: V1's scheduler stops admitting when
    # len(running) == max_num_running_reqs (v1/core/sched/scheduler.py ``schedule``), V0's
    # when num_curr_seqs + num_new_seqs > max_num_seqs (core/scheduler.py
    # ``SchedulingBudget.can_schedule``). Closed-loop users keep at most one request each in
    # the server, so no engine (of one or several replicas) runs more than the users
    # offered: when no load the trial replayed offered more users than max-num-seqs, the
    # cap never held a request back, at the scored load or at the loads that placed the
    # edge. (The decode batches stay under the CUDA-graph capture sizes, which reach
    # max-num-seqs, in both.) And the edge must have been placed by the target, a load
    # that missed it (``failing``), not by the search's load cap, which is max-num-seqs x
    # replicas: a trial stopped at its cap measured the cap. Open-loop loads: never folded.
    seqs = config.get("max_num_seqs")
    if run.get("load_kind") != "concurrency" or not levels or not is_int(seqs) or failing is None:
        return None
    most = max(levels)
    if not most > 0 or most > seqs:
        return None
    return f"at most {most:,.0f} users offered, never more than max-num-seqs"


def _prefix_caching(run: Mapping[str, Any], server: Mapping[str, Any] | None) -> str | None:
    # V1 hashes each full block and looks it up; with no block shared between requests
    # nothing hits (tuner's prompts are unique per request and salted per run,
    # tuner.traffic.shape.prompt_token_ids), and V1's cache costs "near-zero performance
    # degradation, even when the cache hit rate is 0%" (vLLM V1 blog, 2025-01-27: why V1
    # turned it on by default; V0's cost CPU time, so never on V0). One exception: a
    # preempted request keeps its full blocks hashed and hits them when it is recomputed
    # (v1/core/sched/scheduler.py ``_preempt_request``; vllm-facts.md section 2), so only
    # when the scored load recorded no preemption.
    if run.get("workload_shares_prefixes") is not False or server is None:
        return None
    if server.get("num_preemptions") != 0:
        return None
    return "no shared prefixes"


def _gpu_memory_utilization(run: Mapping[str, Any], server: Mapping[str, Any] | None) -> str | None:
    # gpu-memory-utilization sizes the KV cache and nothing else that runs per step: what
    # is left of that share of the GPU after the weights, activations and CUDA graphs
    # becomes KV blocks (vllm-facts.md section 1). The blocks bound how many requests run
    # at once (a request that finds none waits or, running, is preempted) and, with
    # prefix caching, how many freed blocks keep their cached prefix. So the share had no
    # effect on a trial whose cache never came near full: no preemption and the peak usage
    # (vllm:kv_cache_usage_perc, polled) at most KV_SPARE at the scored load, so that the
    # load just above it (the edge's upper bracket) had room to spare too and the cap the
    # search met, if any, was max-num-seqs; and no shared prefixes to keep.
    if server is None or server.get("num_preemptions") != 0:
        return None
    usage = server.get("kv_cache_usage_max")
    if run.get("workload_shares_prefixes") is not False or not is_number(usage) or not 0 <= usage <= KV_SPARE:
        return None
    return f"the KV cache peaked at {usage:.0%} of its blocks, no preemption"


def _block_size(run: Mapping[str, Any], server: Mapping[str, Any] | None) -> str | None:
    # The block size is the KV cache's unit of allocation and of prefix-cache hashing: the
    # cache holds memory // bytes per block blocks, bytes per block proportional to the
    # block size, so the same tokens whatever the size (vllm-facts.md section 1: page_size_bytes,
    # num_gpu_blocks); a request holds cdiv(its tokens, block_size) blocks, at most one
    # partly filled. So where the cache never came near full (no preemption, the peak usage
    # at most KV_SPARE at the scored load) and no request shares a prefix to hash, no
    # request waited for, or hit, a block because of its size.
    why = _gpu_memory_utilization(run, server)
    return None if why is None else f"{why}, no shared prefixes"


def _max_model_len(config: Mapping[str, Any], run: Mapping[str, Any], started: bool) -> str | None:
    # V1 allocates KV blocks as a request grows (v1/core/kv_cache_manager.py
    # ``allocate_slots``); their number is the memory left // bytes per block whatever the
    # length (v1/core/kv_cache_planning.py; vllm-facts.md section 1). The length bounds a
    # request (longer prompts refused, max_tokens clamped: section 5), nothing to a request
    # that fits, and enters the startup check that one request of that length fits the
    # cache (error (b)): so only among trials that started. Two lesser uses: with
    # --max-num-batched-tokens unset the default budget is capped at max_num_seqs x
    # max_model_len (section 2), folded only where that cap cannot bind; and the per-slot
    # block table (v1/worker/block_table.py, max_num_seqs x cdiv(len, block_size) int32 on
    # the GPU: 8 MiB at 1024 x 32k) is taken from the KV memory, a few blocks of thousands.
    longest = run.get("workload_longest_tokens")
    length = config.get("max_model_len") or (run.get("plan") or {}).get("max_model_len")
    if not started or not isinstance(longest, int) or longest <= 0 or not isinstance(length, int):
        return None
    if length < longest:
        return None
    if config.get("max_num_batched_tokens") is None:
        seqs = config.get("max_num_seqs") or DEFAULT_SEQS_MIN
        if seqs * longest < DEFAULT_BUDGET_MAX:
            return None
    return f">= {longest:,} tokens, the longest request"


def applied(run: Mapping[str, Any]) -> bool:
    """Whether the trial's server was started with its configuration: the backend's
    ``restarts`` capability as the trial recorded it (:mod:`tuner.search.backend`); a
    study recorded before capabilities were, by its backend's name (:data:`APPLIED`)."""
    if run.get("restarts") is not None:
        return bool(run["restarts"])
    return run.get("backend") in APPLIED


def no_effect(config: Mapping[str, Any], run: Mapping[str, Any], *, started: bool = False,
              server: Mapping[str, Any] | None = None, levels: Sequence[float] | None = None,
              failing: float | None = None) -> dict[str, str]:
    """Knob -> why it had no effect on this trial's throughput, for the knobs of
    ``config`` (a trial's ``user_attrs["config"]``) that the rules fold.

    ``run`` is the trial's ``user_attrs["run"]``; ``started``: vLLM started with this
    configuration (the trial was measured); ``server``: the readings at the scored load
    (``user_attrs["server"]``); ``levels``: every load the trial replayed (users or
    requests/s, as ``run["load_kind"]``), ``failing``: the lowest of them that missed the
    target (the edge's upper bracket). Empty when a fact a rule needs is missing."""
    engine = _engine(run)
    if not applied(run) or engine is None:
        return {}
    out: dict[str, str] = {}
    if "max_num_seqs" in config and started and (why := _max_num_seqs(config, run, levels, failing)):
        out["max_num_seqs"] = why
    if engine != "v1":
        return out
    if "enable_prefix_caching" in config and (why := _prefix_caching(run, server)):
        out["enable_prefix_caching"] = why
    if "max_model_len" in config and (why := _max_model_len(config, run, started)):
        out["max_model_len"] = why
    if "gpu_memory_utilization" in config and started and (why := _gpu_memory_utilization(run, server)):
        out["gpu_memory_utilization"] = why
    if "block_size" in config and started and (why := _block_size(run, server)):
        out["block_size"] = why
    return out


def effective_config(config: Mapping[str, Any], run: Mapping[str, Any], *, started: bool = False,
                     server: Mapping[str, Any] | None = None, levels: Sequence[float] | None = None,
                     failing: float | None = None) -> dict[str, Any]:
    """``config`` with each knob of :func:`no_effect` replaced by :data:`ANY`."""
    folded = no_effect(config, run, started=started, server=server, levels=levels, failing=failing)
    return {k: ANY if k in folded else v for k, v in config.items()}


def group_key(config: Mapping[str, Any], run: Mapping[str, Any], *, started: bool = False,
              server: Mapping[str, Any] | None = None, levels: Sequence[float] | None = None,
              failing: float | None = None) -> str:
    """The effective configuration as canonical JSON: one key per group of trials."""
    return json.dumps(effective_config(config, run, started=started, server=server, levels=levels,
                                       failing=failing), sort_keys=True)


def trial_group(rec: TrialRecord, *, started: bool) -> tuple[str | None, dict[str, str]]:
    """A trial's :func:`group_key` and :func:`no_effect`, from the facts its record holds
    (None and nothing for a trial without a configuration)."""
    if rec.config is None:
        return None, {}
    config = rec.config.to_dict()
    facts = {"run": rec.run.to_dict(), "server": rec.server, "started": started,
             "levels": [p.level for p in rec.loads if p.level is not None],
             "failing": rec.edge.failing_level if rec.edge is not None else None}
    return group_key(config, **facts), no_effect(config, **facts)


def caveat(run: Mapping[str, Any]) -> str | None:
    """Why the configurations cannot be told apart at all, or ``None``."""
    if run.get("restarts") is False or (run.get("restarts") is None and run.get("backend") == "endpoint"):
        return (f"backend {run.get('backend') or '?'}: tuner measured a server it did not start and applied none of these "  # noqa: E501
                "configurations, so trials differ by measurement noise only; nothing is folded")
    return None


__all__ = ["ANY", "applied", "caveat", "effective_config", "group_key", "no_effect", "trial_group"]

"""The headroom rule of the confirmation race (:mod:`tuner.study.race`, item 4): among ties
the repeats cannot tell apart that differ only in headroom knobs, which one is recommended,
and the words that say why. Pure: configurations as dicts of knob values.

Which way gpu-memory-utilization leans, decided on the measured starts
(``python benchmarks/kv_error.py``): a tie was started and measured, and vLLM's KV cache
comes out the same on every start of one configuration (0 to 0.11 % apart over 9 pairs of
fresh starts on an H100 and an H200, vLLM 0.26.0), so the tie with less KV memory does not
fail to start where it started once; what its smaller cache risks is the traffic: where it
filled at the edge (:func:`kv_filled`: preemptions, or 95 % of its blocks in use), a longer
request than the sample held preempts or waits there first. The planner's own KV error
(mostly optimistic: vLLM found up to 0.98 % less than predicted on dense shapes on an H100,
16.6 % on the MoE shape) does not enter: the ties' caches were measured, not predicted. So
the rule leans to less memory (room for other work and fragmentation; vLLM 0.26.0 also
holds its CUDA graphs outside the budget) where the ties' caches had room, and to more KV
memory where one of them filled: a memory-tight card."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.core.knobs import KNOBS

#: A KV cache this full at the edge (share of its blocks at the peak) left the traffic no room.
KV_FULL = 0.95


def kv_filled(server: Mapping[str, Any] | None) -> bool:
    """Whether a measurement's server readings (at its scored load) say the KV cache filled:
    requests were preempted, or :data:`KV_FULL` of its blocks were in use at the peak."""
    s = server or {}
    return float(s.get("num_preemptions") or 0) > 0 or float(s.get("kv_cache_usage_max") or 0) >= KV_FULL


def headroom_key(config: dict[str, Any], tight: bool = False) -> tuple[float, ...]:
    """Sorts the configuration with the most headroom first, by the knobs whose rows say how
    (:data:`HEADROOM_KNOBS`, in the rows' order): lower gpu-memory-utilization (memory left to
    other work and to fragmentation; higher where ``tight``: a KV cache of the ties filled at
    the edge, see the module docstring), fewer max-num-seqs (less preemption risk on longer
    requests), CUDA graphs rather than eager, fewer API server processes (CPU cores left to
    the host). An unset knob counts as its row's ``headroom`` value."""
    key = []
    for k in _HEADROOM_ROWS:
        given = config.get(k.name)
        value = float(bool(given)) if k.type is bool else float(given or k.headroom)  # type: ignore[arg-type]
        key.append(-value if tight and k.name == "gpu_memory_utilization" else value)
    return tuple(key)


#: The knobs :func:`headroom_key` weighs (rows of :data:`tuner.core.knobs.KNOBS` with a
#: ``headroom``); a tie is traded for headroom only where nothing else differs.
_HEADROOM_ROWS = tuple(k for k in KNOBS if k.headroom is not None)
HEADROOM_KNOBS = tuple(k.name for k in _HEADROOM_ROWS)


def headroom_tie(c: Any, leader: Any) -> bool:
    """Whether a tie ``c`` may be preferred to ``leader`` for headroom: the two differ in no
    knob but the headroom ones, and where ``c`` has fewer max-num-seqs its cap never bound.
    Two that differ in a knob that changes speed (the KV dtype, the batched-token budget,
    the layout) and measure the same are tied by noise, not by design; and a max-num-seqs
    that bound at the edge is the configuration's limit, not spare room: in both cases the
    better mean is kept rather than traded for headroom."""
    a, b = c.config, leader.config
    if any(a.get(k) != b.get(k) for k in {*a, *b} - set(HEADROOM_KNOBS)):
        return False
    fewer = float(a.get("max_num_seqs") or 1e9) < float(b.get("max_num_seqs") or 1e9)
    return not (fewer and c.capped)


def why(chosen: dict[str, Any], other: dict[str, Any], tight: bool = False) -> str:
    """Why ``chosen`` was preferred to ``other``: the first headroom knob they differ in."""
    for key, label in (("gpu_memory_utilization", "gpu-memory-utilization"), ("max_num_seqs", "max-num-seqs")):
        a, b = chosen.get(key), other.get(key)
        if a != b:
            room = " (more KV memory: a tie's KV cache filled at its edge)" if tight and key == "gpu_memory_utilization" else ""  # noqa: E501
            return f"{label} {a} vs {b}{room}"
    if bool(chosen.get("enforce_eager")) != bool(other.get("enforce_eager")):
        return "CUDA graphs instead of eager"
    a, b = int(chosen.get("api_server_count") or 1), int(other.get("api_server_count") or 1)
    return f"{a} API server process{'es' * (a > 1)} instead of {b} (CPU cores left to the host)"


__all__ = ["HEADROOM_KNOBS", "KV_FULL", "headroom_key", "headroom_tie", "kv_filled", "why"]

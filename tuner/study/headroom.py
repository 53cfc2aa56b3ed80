"""The headroom rule of the confirmation race (:mod:`tuner.study.race`, item 4): among ties
the repeats cannot tell apart that differ only in headroom knobs, which one is recommended,
and the words that say why. Pure: configurations as dicts of knob values."""
from __future__ import annotations

from typing import Any


def headroom_key(config: dict[str, Any]) -> tuple[float, float, int, int]:
    """Sorts the configuration with the most headroom first: lower gpu-memory-utilization
    (memory left to other work and to fragmentation), fewer max-num-seqs (less preemption
    risk on longer requests), CUDA graphs rather than eager, fewer API server processes
    (CPU cores left to the host)."""
    return (float(config.get("gpu_memory_utilization") or 1.0), float(config.get("max_num_seqs") or 1e9),
            int(bool(config.get("enforce_eager"))), int(config.get("api_server_count") or 1))


#: The knobs :func:`headroom_key` weighs; a tie is traded for headroom only where nothing
#: else differs.
HEADROOM_KNOBS = ("gpu_memory_utilization", "max_num_seqs", "enforce_eager", "api_server_count")


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


def why(chosen: dict[str, Any], other: dict[str, Any]) -> str:
    """Why ``chosen`` was preferred to ``other``: the first headroom knob they differ in."""
    for key, label in (("gpu_memory_utilization", "gpu-memory-utilization"), ("max_num_seqs", "max-num-seqs")):
        a, b = chosen.get(key), other.get(key)
        if a != b:
            return f"{label} {a} vs {b}"
    if bool(chosen.get("enforce_eager")) != bool(other.get("enforce_eager")):
        return "CUDA graphs instead of eager"
    a, b = int(chosen.get("api_server_count") or 1), int(other.get("api_server_count") or 1)
    return f"{a} API server process{'es' * (a > 1)} instead of {b} (CPU cores left to the host)"


__all__ = ["HEADROOM_KNOBS", "headroom_key", "headroom_tie", "why"]

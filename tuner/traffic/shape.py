"""Shaping a workload before replay: cut a time window, sample, compress time, turn
logged timestamps into a closed-loop order, truncate to ``max_model_len``, and make the
prompt token ids that realise the prefix structure.

Every function returns a new :class:`Workload`; the input is never changed.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tuner.core.errors import InputError
from tuner.traffic._prefix import mix as _mix
from tuner.traffic.stats import trace_stats
from tuner.traffic.workload import Workload

__all__ = [
    "closed_loop_order",
    "prompt_token_ids",
    "sample",
    "scale_rate",
    "trace_stats",
    "truncate",
    "window",
]


def _noted(w: Workload, note: str) -> Workload:
    return replace(w, notes=w.notes + (note,))


def window(w: Workload, start_s: float | None = None, end_s: float | None = None) -> Workload:
    """Requests arriving in ``[start_s, end_s)`` seconds (from the first arrival), rebased to 0."""
    lo = -np.inf if start_s is None else start_s
    hi = np.inf if end_s is None else end_s
    if not lo < hi:
        raise InputError(f"empty time window [{start_s}, {end_s})", hint="the start must be before the end")
    t = w.arrival_s - (w.arrival_s[0] if len(w) else 0.0)
    idx = np.flatnonzero((t >= lo) & (t < hi))
    if not len(idx):
        raise InputError(f"no requests in the window [{start_s}, {end_s}) s; the trace spans {w.span_s:.1f} s")
    hi_txt = "the end" if end_s is None else f"{end_s:g} s"
    return _noted(w.take(idx), f"window {start_s or 0:g} s to {hi_txt}: {len(idx):,} of {len(w):,} requests")


def sample(
    w: Workload, n: int | None = None, *, fraction: float | None = None, seed: int = 0,
    by_session: bool | None = None,
) -> Workload:
    """A seeded random subset, in arrival order: ``n`` requests or a ``fraction`` of them.

    With sessions (default when the workload has them) whole conversations are kept or
    dropped, so that no turn loses its earlier turns; ``n`` then counts requests and is
    met as closely as whole sessions allow (never exceeded unless one session is larger)."""
    if (n is None) == (fraction is None):
        raise InputError("give either a number of requests or a fraction to sample")
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise InputError(f"sample fraction must be in (0, 1], got {fraction}")
        n = max(1, round(fraction * len(w)))
    if n < 1:
        raise InputError(f"sample size must be >= 1, got {n}")
    if n >= len(w):
        return w
    rng = np.random.default_rng(seed)
    if by_session is None:
        by_session = w.session is not None
    if not by_session or w.session is None:
        idx = np.sort(rng.choice(len(w), size=n, replace=False))
    else:
        keys = np.array([f"\x00{i}" if s is None else s for i, s in enumerate(w.session)], dtype=object)
        uniq, inverse, sizes = np.unique(keys, return_inverse=True, return_counts=True)
        chosen = np.zeros(len(uniq), dtype=bool)
        total = 0
        for k in rng.permutation(len(uniq)):
            if total + sizes[k] > n and total > 0:
                continue
            chosen[k] = True
            total += sizes[k]
            if total >= n:
                break
        idx = np.flatnonzero(chosen[inverse])
    return _noted(w.take(idx), f"sampled {len(idx)} of {len(w)} requests (seed {seed})")


def scale_rate(w: Workload, multiplier: float) -> Workload:
    """Compress time: ``multiplier`` 2 replays the log twice as fast (span halves)."""
    if not multiplier > 0:
        raise InputError(f"rate multiplier must be > 0, got {multiplier}")
    return _noted(replace(w, arrival_s=w.arrival_s / multiplier), f"rate x{multiplier:g}")


def closed_loop_order(w: Workload) -> Workload:
    """Logged timestamps to a closed-loop order: every arrival at t=0, requests grouped
    by session (sessions in order of their first request, turns in logged order), so a
    user that takes the next request plays conversations turn by turn. Requests without
    a session stay single, at the place of their logged time."""
    n = len(w)
    if w.session is None:
        order = np.arange(n)
    else:
        first: dict[str, int] = {}
        group = np.empty(n, dtype=np.int64)
        for i, s in enumerate(w.session):
            group[i] = i if s is None else first.setdefault(s, i)
        order = np.lexsort((np.arange(n), group))
    pick = lambda col: None if col is None else [col[i] for i in order]  # noqa: E731
    return Workload(
        arrival_s=np.zeros(n),
        prompt_tokens=w.prompt_tokens[order],
        output_tokens=w.output_tokens[order],
        session=pick(w.session),
        turn=None if w.turn is None else w.turn[order],
        hash_ids=pick(w.hash_ids),
        block_tokens=w.block_tokens,
        source=w.source,
        estimated_tokens=w.estimated_tokens,
        notes=w.notes + ("closed-loop order: arrivals dropped, sessions kept together",),
    )


def truncate(w: Workload, max_model_len: int, *, drop: bool = False) -> tuple[Workload, int]:
    """Fit every request in ``max_model_len`` (prompt + output tokens, vLLM's limit).

    Returns the workload and how many requests were cut. A request over the limit keeps
    its output (capped at ``max_model_len - 1``) and loses the end of its prompt (its
    hash ids are cut to match); with ``drop`` it is removed instead."""
    if not isinstance(max_model_len, (int, np.integer)) or max_model_len < 2:
        raise InputError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
    over = (w.prompt_tokens + w.output_tokens) > max_model_len
    cut = int(over.sum())
    if not cut:
        return w, 0
    if drop:
        keep = np.flatnonzero(~over)
        if not len(keep):
            raise InputError(f"every request is longer than max_model_len {max_model_len}")
        return _noted(w.take(keep, rebase=False), f"dropped {cut} requests over {max_model_len} tokens"), cut
    out = np.minimum(w.output_tokens, max_model_len - 1)
    prompt = np.minimum(w.prompt_tokens, max_model_len - out)
    hash_ids = w.hash_ids
    if hash_ids is not None:
        b = w.block_tokens
        hash_ids = [tuple(ids[: math.ceil(int(p) / b)]) if o else tuple(ids)
                    for ids, p, o in zip(hash_ids, prompt, over)]
    return _noted(
        replace(w, prompt_tokens=prompt, output_tokens=out, hash_ids=hash_ids),
        f"truncated {cut} requests to {max_model_len} tokens",
    ), cut


# -- prompt token ids -----------------------------------------------------------------------
def prompt_token_ids(
    w: Workload, i: int, *, vocab_size: int, low: int = 0, seed: int = 0,
) -> list[int]:
    """Token ids for request ``i``'s prompt, exactly ``prompt_tokens[i]`` long, in
    ``[low, vocab_size)``, the same on every call.

    Token ``k`` of block ``j`` (``block_tokens`` per block) is a hash of the request's
    ``j``-th hash id and ``k``: requests sharing leading hash ids share those leading
    tokens exactly, so a prefix cache sees the reuse the trace logged. Tokens beyond the
    hash ids (or all of them, without prefix structure) hash the request index and
    position, so they are not shared with any other request."""
    if not vocab_size > low >= 0:
        raise InputError(f"need 0 <= low < vocab_size, got low={low}, vocab_size={vocab_size}")
    n = int(w.prompt_tokens[i])
    b = int(w.block_tokens)
    ids = w.hash_ids[i] if w.hash_ids is not None else ()
    pos = np.arange(n, dtype=np.uint64)
    keys = np.empty(n, dtype=np.uint64)
    shared = min(len(ids) * b, n)
    salt = _mix(np.array([seed], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        if shared:
            block = np.asarray(ids, dtype=np.uint64)[(pos[:shared] // np.uint64(b)).astype(np.int64)]
            keys[:shared] = _mix(_mix(block * np.uint64(2) ^ salt) + pos[:shared] % np.uint64(b))
        if shared < n:
            base = _mix(np.array([i], dtype=np.uint64) * np.uint64(2) + np.uint64(1) ^ salt)
            keys[shared:] = _mix(base + pos[shared:])
    return ((keys % np.uint64(vocab_size - low)).astype(np.int64) + low).tolist()

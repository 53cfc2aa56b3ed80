"""The request table of one engine, or of the replicas of one deployment that share it
(a request lives on one replica only): :class:`RequestTable`, one numpy array per field,
indexed by the request's number; and the cache units of a prompt (:func:`shared_units`)."""
from __future__ import annotations

import numpy as np

from tuner.sim.scheduler.steps import _EMPTY, _I


def shared_units(hash_ids: tuple[int, ...], block_tokens: int, prompt_tokens: int,
                 block_size: int) -> list[tuple[object, int]]:
    """Cache units of a prompt whose ``block_tokens``-token pieces are named by ``hash_ids``:
    the engine blocks (``block_size`` tokens, full, inside the named part of the prompt)
    whose last token lies in piece k form unit k, keyed by the chained hash of ids 0..k and
    its block count (vLLM: ``hash_block_tokens(parent_hash, tokens)``)."""
    units: list[tuple[object, int]] = []
    covered = min(len(hash_ids) * block_tokens, prompt_tokens)
    chain = 0
    prev_blocks = 0
    for k, hid in enumerate(hash_ids):
        if k * block_tokens >= covered:
            break
        chain = hash((chain, int(hid)))
        end_blocks = min((k + 1) * block_tokens, covered) // block_size
        n = end_blocks - prev_blocks
        prev_blocks = end_blocks
        if n > 0:
            units.append((("shared", chain, n), n))
    return units


class RequestTable:
    """Per request ``j`` (numbered in order of :meth:`load`): its prompt and output limit,
    the tokens it got, its prefix-cache hit at first admission and its times (NaN until
    they come), and the cache units its prompt names."""

    _INTS = ("prompt", "max_out", "out", "cached")
    _TIMES = ("t_sched", "t_first", "t_done", "t_last")

    def __init__(self, max_model_len: int, caching: bool, block_size: int) -> None:
        self.max_model_len = max_model_len
        self.caching = caching
        self.block_size = block_size
        self.cap = 0
        self.n = 0
        self.prompt = _EMPTY.copy()
        self.max_out = _EMPTY.copy()
        self.out = _EMPTY.copy()
        self.cached = _EMPTY.copy()     # prefix-hit tokens at first admission
        self.t_sched = np.zeros(0)      # first time scheduled (NaN until then)
        self.t_first = np.zeros(0)      # first token
        self.t_done = np.zeros(0)       # finished
        self.t_last = np.zeros(0)       # last token (for ITL)
        self.hashes: dict[int, tuple[tuple[int, ...], int]] = {}   # j -> (hash_ids, block_tokens)
        self._units: dict[int, list[tuple[object, int]]] = {}      # j -> shared units (lazy)

    def _ensure(self, cap: int) -> None:
        if cap <= self.cap:
            return
        cap = max(cap, 16, 2 * self.cap)
        for name in self._INTS:
            a = getattr(self, name)
            b = np.zeros(cap, dtype=_I)
            b[: len(a)] = a
            setattr(self, name, b)
        for name in self._TIMES:
            a = getattr(self, name)
            b = np.full(cap, np.nan)
            b[: len(a)] = a
            setattr(self, name, b)
        self.cap = cap

    def load(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
             hash_ids: list[tuple[int, ...]] | None = None, block_tokens: int = 512) -> int:
        """Register requests in bulk; returns the number of the first. Output is clamped to
        ``max_model_len - prompt`` as vLLM clamps ``max_tokens``."""
        base = self.n
        m = len(prompt_tokens)
        self._ensure(base + m)
        prompts = np.asarray(prompt_tokens, dtype=_I)
        self.prompt[base: base + m] = prompts
        self.max_out[base: base + m] = np.maximum(
            1, np.minimum(np.asarray(output_tokens, dtype=_I), self.max_model_len - prompts))
        if self.caching and hash_ids is not None:
            for i, h in enumerate(hash_ids):
                if len(h):
                    self.hashes[base + i] = (tuple(h), block_tokens)
        self.n = base + m
        return base

    def units_of(self, j: int) -> list[tuple[object, int]]:
        """The shared cache units of request ``j``'s prompt (computed once)."""
        u = self._units.get(j)
        if u is None:
            h = self.hashes.get(j)
            u = shared_units(h[0], h[1], int(self.prompt[j]), self.block_size) if h else []
            self._units[j] = u
        return u

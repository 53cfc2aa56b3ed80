"""Prefix block ids for text logs, so that replay and the simulator see the prefix reuse
a chat service really has (a shared system prompt, each turn re-sending the earlier
ones).

A prompt is laid out as its messages' token counts (framing included, see
:mod:`tuner.traffic._text`). Block ``j`` covers tokens ``[j*B, (j+1)*B)``; its id hashes
everything that determines those tokens: the chain of messages up to the one the
block ends in, and the end position. Two prompts whose leading messages are equal
therefore get equal leading ids, and nothing else does. Ids are 63-bit hashes rather
than a lookup table, so a log of millions of blocks needs no memory for them.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_LOW63 = np.uint64(0x7FFFFFFFFFFFFFFF)


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele, Lea, Flood, "Fast splittable pseudorandom number
    generators", OOPSLA 2014), vectorised over uint64: a bijection with good avalanche."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _h(*parts: bytes) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(p)
        h.update(b"\x1f")
    return int.from_bytes(h.digest(), "little")


def chat_block_ids(
    messages: Sequence[tuple[str, str]],
    counts: Sequence[int],
    prompt_tokens: int,
    block_tokens: int,
    *,
    head: int,
    primer: int,
    unique: int,
) -> tuple[int, ...]:
    """Block ids of a prompt made of ``messages`` (``(role, text)``) of ``counts`` tokens
    each (``head`` of them the role header), then ``primer`` tokens opening the reply.

    ``prompt_tokens`` may differ from the layout (a logged exact count against estimated
    message counts): blocks past the layout get ids unique to this request (``unique``)."""
    n = math.ceil(prompt_tokens / block_tokens)
    if n == 0:
        return ()
    seg_end, head_end, key_head, key_full = [], [], [], []
    chain, pos = _h(b"chain"), 0
    for (role, text), c in zip(messages, counts):
        before = chain
        chain = _h(before.to_bytes(8, "little"), role.encode(), text.encode("utf-8", "surrogatepass"))
        key_head.append(_h(before.to_bytes(8, "little"), b"head", role.encode()))
        key_full.append(chain)
        head_end.append(pos + min(head, c))
        pos += c
        seg_end.append(pos)
    reply = _h(chain.to_bytes(8, "little"), b"head", b"assistant")
    lone = _h(b"unique", str(unique).encode())
    seg_end += [pos + primer, np.iinfo(np.int64).max]
    head_end += [pos + primer, np.iinfo(np.int64).max]
    key_head += [reply, lone]
    key_full += [reply, lone]
    ends = np.minimum(np.arange(1, n + 1, dtype=np.int64) * block_tokens, prompt_tokens)
    seg = np.searchsorted(np.asarray(seg_end, dtype=np.int64), ends, side="left")
    in_head = ends <= np.asarray(head_end, dtype=np.int64)[seg]
    base = np.where(in_head, np.asarray(key_head, dtype=np.uint64)[seg], np.asarray(key_full, dtype=np.uint64)[seg])
    ids = (mix(base ^ mix(ends.astype(np.uint64))) & _LOW63).astype(np.int64)
    return tuple(ids.tolist())

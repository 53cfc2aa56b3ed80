"""Prompts of an exact logged length, as token ids.

The replayer sends ``/v1/completions`` a list of token ids, so the server sees exactly
the logged prompt length without any tokenizer on the client. Requests that share
leading prefix blocks (``Workload.hash_ids``) get the same leading ids, block by block
(the traffic package's :func:`~tuner.traffic.shape.prompt_token_ids`), so a server's
prefix cache hits exactly where the log says it would; everything else is unique to the
request (no accidental cache hits between unrelated prompts).

Ids are drawn from ``[ID_LOW, ID_HIGH)``: ordinary vocabulary entries in every common
tokenizer (Llama/Qwen/Mistral vocabularies are >= 32,000), well clear of special tokens.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.traffic.shape import prompt_token_ids

if TYPE_CHECKING:
    from tuner.traffic.workload import Workload

ID_LOW, ID_HIGH = 1000, 30000

#: Common English words, one token each in the usual BPE vocabularies; used for the
#: chat API, where prompts are text (the token count is then only approximate).
WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are be this which "
    "or had not but also first one their its new after who they have has been two more time when "
    "she other into all during school other there may up year can most some"
).split()


def prompt_ids(workload: Workload, i: int, *, salt: int = 0) -> list[int]:
    """Request ``i``'s prompt ids: exactly its logged length, shared prefix blocks as shared
    ids (:func:`tuner.traffic.shape.prompt_token_ids`), ids in ``[ID_LOW, ID_HIGH)``."""
    return prompt_token_ids(workload, i, vocab_size=ID_HIGH, low=ID_LOW, seed=salt)


def prompt_text(ids: list[int]) -> str:
    """A text rendering of ``ids`` for the chat API: one common word per id."""
    return " ".join(WORDS[i % len(WORDS)] for i in ids)

"""ShareGPT-style conversations: a JSON array (or JSON lines) of
``{"id": ..., "conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}``
(the layout of ShareGPT_V3_unfiltered_cleaned_split.json that vLLM's benchmarks use);
``"messages": [{"role": "user", "content": ...}]`` works too.

Every user message answered by an assistant message becomes one request of the
conversation's session: its prompt is the whole conversation so far (chat framing
included, see :mod:`tuner.traffic._text`), its output the reply. Turns of one
conversation share their prefix: each turn's prompt extends the previous turn's prompt
and reply, so its leading blocks reuse the previous turn's block ids (16-token blocks,
vLLM's default ``--block-size``). There are no arrival times: all requests are at t=0,
in conversation order, for closed-loop replay or a rate chosen at run time.
"""
from __future__ import annotations

import math

from tuner.traffic._rows import BAD_VALUE, MISSING, BadRows, Collected, SkipRow, iter_records, read_text
from tuner.traffic._text import MESSAGE_OVERHEAD, REPLY_PRIMER, TokenCounter, content_text
from tuner.traffic.workload import Workload

BLOCK_TOKENS = 16
ASSISTANT = {"gpt", "assistant", "chatgpt", "bard", "model", "bot"}


def read(path: str, *, skip_bad: bool = False, tokenizer: str | None = None, **_: object) -> Workload:
    bad = BadRows(path, skip_bad)
    counter = TokenCounter(tokenizer)
    rows = Collected()
    next_id = 0
    for index, (line, obj) in enumerate(iter_records(read_text(path), bad)):
        try:
            turns = _messages(obj, line, bad)
        except SkipRow:
            continue
        session = str(obj.get("id", f"#{index}"))
        context = 0
        prompt: int | None = None
        history: list[int] = []  # block ids of the conversation's full blocks so far
        turn = 0
        for role, text in turns:
            tokens = counter.count(text)
            if role in ASSISTANT:
                if prompt is not None:
                    n_blocks = math.ceil(prompt / BLOCK_TOKENS)
                    fresh = list(range(next_id, next_id + n_blocks - len(history)))
                    next_id += len(fresh)
                    ids = history[:n_blocks] + fresh
                    rows.add(0.0, prompt, tokens, session=session, turn=turn, hash_ids=tuple(ids))
                    history = ids[: prompt // BLOCK_TOKENS]
                    turn += 1
                prompt = None
            context += MESSAGE_OVERHEAD + tokens
            if role not in ASSISTANT:
                prompt = context + REPLY_PRIMER
    notes = (counter.note,) if counter.note else ()
    return rows.workload(path, bad, block_tokens=BLOCK_TOKENS, estimated=counter.estimated, notes=notes)


def _messages(obj: dict, line: int, bad: BadRows) -> list[tuple[str, str]]:
    msgs = obj.get("conversations", obj.get("messages"))
    if msgs is None:
        raise bad.row(line, MISSING, "no conversations (or messages) list")
    if not isinstance(msgs, list):
        raise bad.row(line, BAD_VALUE, "conversations must be a list of messages")
    out = []
    for m in msgs:
        if not isinstance(m, dict):
            raise bad.row(line, BAD_VALUE, "each message must be an object with from/value or role/content")
        role = m.get("from", m.get("role"))
        text = content_text(m.get("value", m.get("content")))
        if not isinstance(role, str) or text is None:
            raise bad.row(line, BAD_VALUE, "each message needs from/value (or role/content) strings")
        out.append((role.lower(), text))
    return out

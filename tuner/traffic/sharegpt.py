"""ShareGPT-style conversations: a JSON array (or JSON lines) of
``{"id": ..., "conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}``
(the layout of ShareGPT_V3_unfiltered_cleaned_split.json that vLLM's benchmarks use);
``"messages": [{"role": "user", "content": ...}]`` works too.

Every user message answered by an assistant message becomes one request of the
conversation's session: its prompt is the whole conversation so far (chat framing
included, see :mod:`tuner.traffic._text`), its output the reply. Prompts get prefix
block ids (16-token blocks, vLLM's default ``--block-size``) from their messages
(:mod:`tuner.traffic._prefix`): each turn re-sends the earlier turns, so its leading
blocks reuse theirs, and conversations that open alike share their opening blocks. There are no arrival times: all requests are at t=0,
in conversation order, for closed-loop replay or a rate chosen at run time.
"""  # noqa: E501
from __future__ import annotations

from tuner.traffic._prefix import chat_block_ids
from tuner.traffic._rows import BAD_VALUE, MISSING, BadRows, Collected, SkipRow, iter_records, read_text
from tuner.traffic._text import MESSAGE_HEAD, MESSAGE_OVERHEAD, REPLY_PRIMER, TokenCounter, content_text
from tuner.traffic.workload import Workload

BLOCK_TOKENS = 16
ASSISTANT = {"gpt", "assistant", "chatgpt", "bard", "model", "bot"}


def read(path: str, *, skip_bad: bool = False, tokenizer: str | None = None, **_: object) -> Workload:
    bad = BadRows(path, skip_bad)
    counter = TokenCounter(tokenizer)
    rows = Collected()
    for index, (line, obj) in enumerate(iter_records(read_text(path), bad)):
        try:
            turns = _messages(obj, line, bad)
        except SkipRow:
            continue
        session = str(obj.get("id", f"#{index}"))
        pairs: list[tuple[str, str]] = []
        counts: list[int] = []
        turn = 0
        for role, text in turns:
            tokens = counter.count(text)
            if role in ASSISTANT and pairs and pairs[-1][0] not in ASSISTANT:
                prompt = sum(counts) + REPLY_PRIMER
                ids = chat_block_ids(pairs, counts, prompt, BLOCK_TOKENS, head=MESSAGE_HEAD,
                                     primer=REPLY_PRIMER, unique=line)
                rows.add(0.0, prompt, tokens, session=session, turn=turn, hash_ids=ids)
                turn += 1
            pairs.append(("assistant" if role in ASSISTANT else role, text))
            counts.append(MESSAGE_OVERHEAD + tokens)
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

"""OpenAI-style request logs, one JSON object per line, as API gateways and proxies
write them:

    {"timestamp": "2024-05-01T10:00:00.123Z",            # or time / created / start_time
     "request": {"model": ..., "messages": [...], "max_tokens": 256},   # or body / the top level
     "response": {"usage": {"prompt_tokens": 812, "completion_tokens": 97}},
     "session_id": "abc"}                                  # or conversation_id / request.user

Token counts come from ``usage`` when logged (exact). Without it the prompt is counted
from the messages (or ``prompt``) text and the output from the response text, else
``max_tokens``; such counts are estimates unless a tokenizer folder is given, and the
workload is marked ``estimated_tokens``. Prompts get prefix block ids from their messages
(:mod:`tuner.traffic._prefix`), so a shared system prompt or a re-sent conversation
shows as prefix reuse. Timestamps are epoch seconds (ms/us/ns are
recognised by magnitude) or ISO 8601; rows must be in time order.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tuner.traffic._prefix import chat_block_ids
from tuner.traffic._rows import (
    BAD_VALUE,
    MISSING,
    UNPARSEABLE_TIME,
    BadRows,
    Clock,
    Collected,
    SkipRow,
    dig,
    iter_jsonl,
    read_text,
    to_length,
    to_number,
)
from tuner.traffic._text import MESSAGE_HEAD, REPLY_PRIMER, TokenCounter, content_text
from tuner.traffic.workload import Workload

TIME_KEYS = ("timestamp", "time", "created", "start_time", "request.created", "response.created")
TOKEN_IDS = "token-ids"
BLOCK_TOKENS = 16  # vLLM's default --block-size
SESSION_KEYS = ("session_id", "conversation_id", "session", "request.user", "body.user", "user")


def read(path: str, *, skip_bad: bool = False, tokenizer: str | None = None, **_: object) -> Workload:
    bad = BadRows(path, skip_bad)
    counter = TokenCounter(tokenizer)
    clock = Clock(bad)
    rows = Collected()
    estimated = False
    turns: dict[str, int] = {}
    for line, obj in iter_jsonl(read_text(path), bad):
        try:
            t = _time(obj, line, bad)
            body = obj.get("request", obj.get("body", obj))
            if not isinstance(body, dict):
                raise bad.row(line, BAD_VALUE, "request must be an object")
            response = obj.get("response")
            usage = dig(response, "usage") if isinstance(response, dict) else None
            usage = usage if isinstance(usage, dict) else obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
            p = to_length(usage.get("prompt_tokens"), "usage.prompt_tokens", line, bad, required=False)
            layout = _prompt_layout(body, counter, line, bad, required=p is None)
            if p is None:
                p = sum(layout[1]) + layout[2]
                estimated |= counter.estimated and layout[0][0][0] != TOKEN_IDS
            o = to_length(usage.get("completion_tokens"), "usage.completion_tokens", line, bad, required=False)
            if o is None:
                o, est = _output_tokens(body, response, counter, line, bad)
                estimated |= est
            clock.check(t, line)
        except SkipRow:
            continue
        session = next((str(v) for k in SESSION_KEYS if (v := dig(obj, k)) is not None and not isinstance(v, (dict, list))),  # noqa: E501
                       None)
        turn = 0
        if session is not None:
            turn = turns.get(session, 0)
            turns[session] = turn + 1
        ids: tuple[int, ...] = ()
        if layout is not None:
            pairs, counts, primer, head = layout
            ids = chat_block_ids(pairs, counts, p, BLOCK_TOKENS, head=head, primer=primer, unique=line)
        rows.add(t, p, o, session=session, turn=turn, hash_ids=ids)
    notes = (counter.note,) if counter.note and estimated else ()
    return rows.workload(path, bad, estimated=estimated, notes=notes, block_tokens=BLOCK_TOKENS)


def _time(obj: dict[str, Any], line: int, bad: BadRows) -> float:
    """Seconds since the epoch of the first time field present."""
    for key in TIME_KEYS:
        value = dig(obj, key)
        if value is None:
            continue
        if isinstance(value, str):
            try:
                when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
                if when.tzinfo is None:
                    when = when.replace(tzinfo=timezone.utc)
                return when.timestamp()
            except (ValueError, OverflowError, OSError):
                value = value.strip()
        x = to_number(value, key, line, bad, UNPARSEABLE_TIME)
        # epoch seconds are ~1.7e9; larger magnitudes are milliseconds, microseconds, nanoseconds
        for limit, scale in ((1e17, 1e-9), (1e14, 1e-6), (1e11, 1e-3)):
            if abs(x) >= limit:
                return x * scale
        return x
    raise bad.row(line, MISSING, "no timestamp (looked for " + ", ".join(TIME_KEYS) + ")")


def _prompt_layout(body: dict[str, Any], counter: TokenCounter, line: int, bad: BadRows, *,
                   required: bool) -> tuple[list[tuple[str, str]], list[int], int, int] | None:
    """``(messages, tokens per message, reply primer, header tokens)`` of the prompt, for
    its token count and prefix blocks; None when the row has no prompt text."""
    messages = body.get("messages")
    if isinstance(messages, list):
        layout = counter.messages(messages)
        if layout is None:
            raise bad.row(line, BAD_VALUE, "messages must be objects with role and text content")
        return layout[0], layout[1], REPLY_PRIMER, MESSAGE_HEAD
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(x, str) for x in prompt):
        prompt = "".join(prompt)
    if isinstance(prompt, str):
        return [("prompt", prompt)], [counter.count(prompt)], 0, 0
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        return [(TOKEN_IDS, repr(prompt))], [len(prompt)], 0, 0  # token ids: an exact count
    if required:
        raise bad.row(line, MISSING, "no usage.prompt_tokens and no messages or prompt to count")
    return None


def _output_tokens(body: dict[str, Any], response: Any, counter: TokenCounter, line: int,
                   bad: BadRows) -> tuple[int, bool]:
    choices = dig(response, "choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices:
        texts = []
        for c in choices:
            if isinstance(c, dict):
                text = c.get("text")
                if text is None and isinstance(c.get("message"), dict):
                    text = content_text(c["message"].get("content"))
                if isinstance(text, str):
                    texts.append(text)
        if texts:
            return sum(counter.count(x) for x in texts), counter.estimated
    for key in ("max_completion_tokens", "max_tokens"):
        n = to_length(body.get(key), key, line, bad, required=False)
        if n is not None:
            return n, True  # an upper bound, not what was generated
    raise bad.row(line, MISSING, "no usage.completion_tokens, response text or max_tokens")

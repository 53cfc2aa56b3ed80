"""OpenAI-style request logs, one JSON object per line, as API gateways and proxies
write them:

    {"timestamp": "2024-05-01T10:00:00.123Z",            # or time / created / start_time
     "request": {"model": ..., "messages": [...], "max_tokens": 256},   # or body / the top level
     "response": {"usage": {"prompt_tokens": 812, "completion_tokens": 97}},
     "session_id": "abc"}                                  # or conversation_id / request.user

Token counts come from ``usage`` when logged (exact). Without it the prompt is counted
from the messages (or ``prompt``) text and the output from the response text, else
``max_tokens``; such counts are estimates unless a tokenizer folder is given, and the
workload is marked ``estimated_tokens``. Timestamps are epoch seconds (ms/us/ns are
recognised by magnitude) or ISO 8601; rows must be in time order.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

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
from tuner.traffic._text import TokenCounter, content_text
from tuner.traffic.workload import Workload

TIME_KEYS = ("timestamp", "time", "created", "start_time", "request.created", "response.created")
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
            if p is None:
                p = _prompt_tokens(body, counter, line, bad)
                estimated |= counter.estimated
            o = to_length(usage.get("completion_tokens"), "usage.completion_tokens", line, bad, required=False)
            if o is None:
                o, est = _output_tokens(body, response, counter, line, bad)
                estimated |= est
            clock.check(t, line)
        except SkipRow:
            continue
        session = next((str(v) for k in SESSION_KEYS if (v := dig(obj, k)) is not None and not isinstance(v, (dict, list))),
                       None)
        turn = 0
        if session is not None:
            turn = turns.get(session, 0)
            turns[session] = turn + 1
        rows.add(t, p, o, session=session, turn=turn)
    notes = (counter.note,) if counter.note and estimated else ()
    return rows.workload(path, bad, estimated=estimated, notes=notes)


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


def _prompt_tokens(body: dict[str, Any], counter: TokenCounter, line: int, bad: BadRows) -> int:
    messages = body.get("messages")
    if isinstance(messages, list):
        n = counter.messages(messages)
        if n is None:
            raise bad.row(line, BAD_VALUE, "messages must be objects with role and text content")
        return n
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return counter.count(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        return len(prompt)  # token ids: an exact count
    if isinstance(prompt, list) and all(isinstance(x, str) for x in prompt):
        return sum(counter.count(x) for x in prompt)
    raise bad.row(line, MISSING, "no usage.prompt_tokens and no messages or prompt to count")


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

"""Request bodies: request ``i`` of a workload as a streaming completion (or chat) request
with its forced output length (:func:`_request`, :func:`_body`)."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tuner.replay.prompts import prompt_ids, prompt_text

if TYPE_CHECKING:
    from tuner.traffic.workload import Workload


def _body(workload: Workload, i: int, model: str, api: str, salt: int) -> bytes:
    return _request(workload, i, model, api, salt)[0]


def _request(workload: Workload, i: int, model: str, api: str, salt: int) -> tuple[bytes, int, int | None]:
    """Request ``i``'s body, its forced output length and (completions) its prompt ids' count."""
    out_len = max(1, int(workload.output_tokens[i]))
    ids = prompt_ids(workload, i, salt=salt)
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": out_len,
        "min_tokens": out_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        common["messages"] = [{"role": "user", "content": prompt_text(ids)}]
    else:
        common["prompt"] = ids
    body = json.dumps(common, separators=(",", ":")).encode()
    return body, out_len, (len(ids) if api != "chat" else None)

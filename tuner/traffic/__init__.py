"""Traffic: read request logs, synthesise workloads, shape the offered load.

``load_trace(path)`` picks a reader by the file's first line (or
``format=``); each format is one module with a ``read(path, *, skip_bad, ...)``
function, listed in :data:`READERS`. Adding a format touches that module and this dict.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tuner.core.errors import InputError
from tuner.traffic import azure, burstgpt, generic, mooncake, native, openai_log, sharegpt, vllm_bench
from tuner.traffic._rows import read_bytes
from tuner.traffic.workload import Request, Workload

READERS: dict[str, Callable[..., Workload]] = {
    "azure": azure.read,
    "burstgpt": burstgpt.read,
    "mooncake": mooncake.read,
    "sharegpt": sharegpt.read,
    "vllm-bench": vllm_bench.read,
    "openai-log": openai_log.read,
    "generic": generic.read,
    "tuner": native.read,
}

FORMAT_HINT = "pass --format " + "|".join(READERS)


def load_trace(
    path: str | Path,
    *,
    format: str | None = None,  # noqa: A002 - the CLI's word
    skip_bad: bool = False,
    mapping: dict[str, str] | None = None,
    tokenizer: str | None = None,
) -> Workload:
    """Read a request log into a :class:`Workload`.

    ``format`` is one of :data:`READERS` (sniffed when None). Bad rows raise
    :class:`~tuner.core.errors.InputError` naming ``file:line``; with ``skip_bad`` they are
    dropped and counted in ``Workload.notes``. ``mapping`` names columns for the
    ``generic`` format; ``tokenizer`` is a local model folder used to count tokens of
    text logs (ShareGPT, vLLM bench, OpenAI logs) exactly.
    """
    p = str(path)
    fmt = format or ("generic" if mapping else sniff(p))
    reader = READERS.get(fmt)
    if reader is None:
        raise InputError(f"unknown trace format {fmt!r}", hint=f"known formats: {', '.join(READERS)}")
    return reader(p, skip_bad=skip_bad, mapping=mapping, tokenizer=tokenizer)


def sniff(path: str) -> str:
    """The format name of ``path``, from its first line (JSON keys or CSV header)."""
    head = read_bytes(path)[:65536].decode("utf-8-sig", errors="replace")
    body = head.lstrip()
    if not body:
        raise InputError("empty file", path=path)
    if body.startswith("["):
        return "sharegpt"
    if body.startswith("{"):
        first = body.splitlines()[0]
        try:
            obj = json.loads(first)
        except (ValueError, RecursionError):  # a deeply nested line: not the format of any trace
            obj = None
        if isinstance(obj, dict):
            keys = set(obj)
            if native.MAGIC in keys:
                return "tuner"
            if keys & {"hash_ids", "input_length"}:
                return "mooncake"
            if keys & {"conversations", "messages"} and not keys & {"request", "response", "body", "usage"}:
                return "sharegpt"
            if "prompt" in keys and "output_tokens" in keys:
                return "vllm-bench"
            if keys & {"request", "response", "body", "usage", "messages", "prompt"}:
                return "openai-log"
        raise InputError(f"cannot tell the trace format from line 1: {first[:60]!r}", path=path, line=1,
                         hint=FORMAT_HINT + " (or --map COLUMNS for --format generic)")
    header = body.splitlines()[0].lower().replace(" ", "")
    if "contexttokens" in header:
        return "azure"
    if "requesttokens" in header:
        return "burstgpt"
    suffix = Path(path).suffix.lower()
    raise InputError(
        f"cannot tell the format of this {suffix or 'file'} from its first line {body.splitlines()[0][:60]!r}",
        path=path, hint=FORMAT_HINT + ", or --format generic --map prompt_tokens=COL --map output_tokens=COL",
    )


from tuner.traffic.shape import prompt_token_ids, trace_stats  # noqa: E402
from tuner.traffic.synth import article_mix, default_workload  # noqa: E402

__all__ = [
    "READERS",
    "Request",
    "Workload",
    "article_mix",
    "default_workload",
    "load_trace",
    "prompt_token_ids",
    "sniff",
    "trace_stats",
]

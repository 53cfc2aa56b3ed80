"""vLLM benchmark "custom" dataset JSONL: one ``{"prompt": ..., "output_tokens": N}``
per line (vLLM ``benchmarks/benchmark_dataset.py``, ``CustomDataset``; also used by
``vllm bench serve --dataset-name custom``). No arrival times: every request is at
t=0, for closed-loop replay or a rate chosen at run time.
"""
from __future__ import annotations

from tuner.traffic._rows import BAD_VALUE, MISSING, BadRows, Collected, SkipRow, iter_jsonl, read_text, to_length
from tuner.traffic._text import TokenCounter
from tuner.traffic.workload import Workload


def read(path: str, *, skip_bad: bool = False, tokenizer: str | None = None, **_: object) -> Workload:
    bad = BadRows(path, skip_bad)
    counter = TokenCounter(tokenizer)
    rows = Collected()
    for line, obj in iter_jsonl(read_text(path), bad):
        try:
            prompt = obj.get("prompt")
            if prompt is None:
                raise bad.row(line, MISSING, "no prompt")
            if not isinstance(prompt, str):
                raise bad.row(line, BAD_VALUE, "prompt must be a string")
            o = to_length(obj.get("output_tokens"), "output_tokens", line, bad)
        except SkipRow:
            continue
        rows.add(0.0, counter.count(prompt), o)
    notes = (counter.note,) if counter.note else ()
    return rows.workload(path, bad, estimated=counter.estimated, notes=notes)

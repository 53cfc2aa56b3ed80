"""Random bytes and random mutations of valid files, fed to every reader (and to format
sniffing): a reader returns a workload or raises TunerError, never anything else."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.core.errors import TunerError
from tuner.traffic import READERS, load_trace
from tuner.traffic.workload import Workload

MAPPING = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o", "session": "s"}

VALID = [
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n",
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n",
    '{"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]}\n'
    '{"timestamp": 1500, "input_length": 600, "output_length": 4, "hash_ids": [0, 3]}\n',
    json.dumps([{"id": "c1", "conversations": [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "hi"}]}]),
    '{"prompt": "hello there", "output_tokens": 12}\n{"prompt": "x", "output_tokens": 3}\n',
    '{"timestamp": "2024-05-01T10:00:00Z", "request": {"messages": [{"role": "user", "content": "hi"}]}, '
    '"response": {"usage": {"prompt_tokens": 8, "completion_tokens": 3}}}\n',
    "t,p,o,s\n1,10,5,a\n2,20,6,b\n",
    '{"t": 1, "p": 3, "o": 4, "s": "a"}\n',
    '{"tuner_workload": 1, "source": "x", "block_tokens": 512, "estimated_tokens": false, '
    '"columns": ["session", "turn", "hash_ids"], "notes": [], "count": 2}\n'
    '{"t": 0.0, "in": 10, "out": 2, "session": "a", "turn": 0, "hash_ids": [1]}\n'
    '{"t": 0.5, "in": 12, "out": 2, "session": "a", "turn": 1, "hash_ids": [1, 2]}\n',
]

NASTY = st.sampled_from(list(',\n\r"{}[]:-.0123456789eE \t\x00') + ["NaN", "null", "1e400", "\ufffd", "Infinity"])


@st.composite
def mutated(draw) -> bytes:
    text = draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 8)))
        op = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        if op == "delete":
            text = text[:i] + text[j:]
        elif op == "insert":
            text = text[:i] + "".join(draw(st.lists(NASTY, max_size=4))) + text[i:]
        elif op == "replace":
            text = text[:i] + draw(NASTY) + text[j:]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                k = draw(st.integers(0, len(lines) - 1))
                lines.insert(k, lines[k])
                text = "".join(lines)
    return text.encode("utf-8", errors="surrogatepass")


def read_everywhere(data: bytes, skip_bad: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.txt"
        path.write_bytes(data)
        for fmt in [None, *READERS]:
            try:
                w = load_trace(path, format=fmt, skip_bad=skip_bad, mapping=MAPPING if fmt == "generic" else None)
            except TunerError as err:
                assert str(err) and "\n" not in str(err).strip()
            else:
                assert isinstance(w, Workload) and len(w) >= 1


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.binary(max_size=300), skip_bad=st.booleans())
def test_random_bytes_raise_only_tuner_errors(data, skip_bad):
    read_everywhere(data, skip_bad)


@FUZZ
@given(data=mutated(), skip_bad=st.booleans())
def test_mutated_valid_files_raise_only_tuner_errors(data, skip_bad):
    read_everywhere(data, skip_bad)

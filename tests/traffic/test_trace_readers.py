"""Every reader on small hand-written files: values read, formats sniffed, and each kind
of bad row reported as ``file:line: what is wrong`` (or skipped and counted)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tuner.core.errors import InputError
from tuner.traffic import load_trace, sniff

HINT = "(use --skip-bad to skip bad rows)"

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_GOOD = (
    AZURE_HEAD
    + "2023-11-16 18:15:46.6805900,374,44\n"
    + "2023-11-16 18:15:50.9951690,396,109\n"
    + "2023-11-16 18:15:51.2224670,879,55\n"
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def jsonl(rows: list) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


# -- Azure ------------------------------------------------------------------------------------
def test_azure_reads_times_and_lengths(tmp_path):
    w = load_trace(write(tmp_path, "a.csv", AZURE_GOOD))
    # 18:15:46.68059 -> 18:15:50.995169 is 4.314579 s (worked by hand)
    np.testing.assert_allclose(w.arrival_s, [0.0, 4.314579, 4.541877], atol=1e-6)
    assert w.prompt_tokens.tolist() == [374, 396, 879]
    assert w.output_tokens.tolist() == [44, 109, 55]
    assert w.hash_ids is None and w.session is None and not w.estimated_tokens


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2023-11-16 18:15:52.0,abc,44", "unparseable number: ContextTokens is 'abc'"),
        ("2023-11-16 18:15:52.0,12.5,44", "unparseable number: ContextTokens is 12.5, not a whole number of tokens"),
        ("2023-11-16 18:15:52.0,374,-3", "negative length: GeneratedTokens is -3"),
        ("2023-11-16 18:15:52.0,374", "missing column: GeneratedTokens is empty"),
        ("yesterday,374,44", "unparseable timestamp: TIMESTAMP is 'yesterday'"),
        ("2023-11-16 18:15:40.0,374,44",
         "timestamps going backwards: TIMESTAMP 2023-11-16 18:15:40 comes after 2023-11-16 18:15:51.222467"),
    ],
)
def test_azure_bad_row_names_file_line_and_what(tmp_path, row, message):
    p = write(tmp_path, "a.csv", AZURE_GOOD + row + "\n" + "2023-11-16 18:16:00.0,1,1\n")
    with pytest.raises(InputError) as err:
        load_trace(p)
    assert str(err.value) == f"{p}:5: {message} {HINT}"
    w = load_trace(p, skip_bad=True)
    assert len(w) == 4
    assert w.notes[0].startswith("skipped 1 bad rows: 1 " + message.split(":")[0] + " (first at line 5)")


def test_azure_first_bad_row_wins_across_kinds_and_skip_counts_each_reason(tmp_path):
    text = AZURE_GOOD + "2023-11-16 18:15:52.0,1,-1\n" + "2023-11-16 18:15:53.0,x,1\n" + "\n" \
        + "2023-11-16 18:15:10.0,5,5\n" + "2023-11-16 18:15:54.0,x,2\n" + "2023-11-16 18:15:55.0,7,7\n"
    p = write(tmp_path, "a.csv", text)
    with pytest.raises(InputError, match=r"a\.csv:5: negative length"):
        load_trace(p)
    w = load_trace(p, skip_bad=True)
    assert w.prompt_tokens.tolist() == [374, 396, 879, 7]
    note = w.notes[0]
    assert note.startswith("skipped 4 bad rows:")
    assert "2 unparseable number (first at line 6)" in note  # the blank line 7 is no row
    assert "1 negative length (first at line 5)" in note
    assert "1 timestamps going backwards (first at line 8)" in note


def test_azure_missing_header_column_and_ragged_row(tmp_path):
    p = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n")
    with pytest.raises(InputError, match=r"a\.csv:1: missing column 'GeneratedTokens' for the azure format"):
        load_trace(p, format="azure")
    p = write(tmp_path, "b.csv", AZURE_GOOD + "2023-11-16 18:15:52.0,1,2,3\n")
    with pytest.raises(InputError) as err:
        load_trace(p)
    assert str(err.value) == f"{p}:5: too many fields: 4 fields, the header has 3 {HINT}"
    assert len(load_trace(p, skip_bad=True)) == 3


def test_quoted_csv_uses_exact_lines(tmp_path):
    text = 'TIMESTAMP,ContextTokens,GeneratedTokens\n"2023-11-16 18:15:46.68","374","44"\n' \
           '"2023-11-16 18:15:47.00","-2","44"\n'
    p = write(tmp_path, "q.csv", text)
    with pytest.raises(InputError, match=r"q\.csv:3: negative length: ContextTokens is '-2'"):
        load_trace(p)


# -- BurstGPT ---------------------------------------------------------------------------------
BURST = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"
    "118,GPT-4,417,276,693,API log\n"
)


def test_burstgpt_drops_failed_requests_and_says_so(tmp_path):
    w = load_trace(write(tmp_path, "b.csv", BURST))
    assert w.arrival_s.tolist() == [0.0, 113.0]
    assert w.prompt_tokens.tolist() == [472, 417]
    assert any("1 failed requests" in n for n in w.notes)


def test_burstgpt_sessions_and_bad_row(tmp_path):
    text = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID,Turn\n" \
           "1,ChatGPT,10,5,15,Conversation log,s1,0\n2,ChatGPT,30,5,35,Conversation log,s1,1\n"
    w = load_trace(write(tmp_path, "b.csv", text))
    assert list(w.session) == ["s1", "s1"] and w.turn.tolist() == [0, 1]
    p = write(tmp_path, "c.csv", BURST + "100,GPT-4,417,276,693,API log\n")
    with pytest.raises(InputError, match=r"c\.csv:5: timestamps going backwards: Timestamp 100 comes after 118"):
        load_trace(p)


# -- Mooncake ---------------------------------------------------------------------------------
MOON = [
    {"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]},
    {"timestamp": 1500, "input_length": 600, "output_length": 4, "hash_ids": [0, 3]},
]


def test_mooncake_reads_ms_and_hash_ids(tmp_path):
    w = load_trace(write(tmp_path, "m.jsonl", jsonl(MOON)))
    assert w.arrival_s.tolist() == [0.0, 1.5]
    assert w.block_tokens == 512
    assert [tuple(h) for h in w.hash_ids] == [(0, 1, 2), (0, 3)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"timestamp": "soon", "input_length": 1, "output_length": 1}, "unparseable timestamp: timestamp is 'soon'"),
        ({"timestamp": 2000, "input_length": "many", "output_length": 1}, "unparseable number: input_length is 'many'"),
        ({"timestamp": 2000, "input_length": -7, "output_length": 1}, "negative length: input_length is -7"),
        ({"timestamp": 2000, "input_length": 5}, "missing column: no output_length"),
        ({"timestamp": 1000, "input_length": 5, "output_length": 1},
         "timestamps going backwards: timestamp 1000 comes after 1500"),
        ('{"timestamp": 2000, "input_length": 5,', "not valid JSON: Expecting property name enclosed in double quotes"
                                                    " at column 39"),  # just past the 38 characters
        ({"timestamp": 2000, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]},
         "bad value: hash_ids must be a list of non-negative integers"),
    ],
)
def test_mooncake_bad_rows(tmp_path, row, message):
    p = write(tmp_path, "m.jsonl", jsonl(MOON + [row, MOON[1] | {"timestamp": 3000}]))
    with pytest.raises(InputError) as err:
        load_trace(p, format="mooncake")
    assert str(err.value) == f"{p}:3: {message} {HINT}"
    assert len(load_trace(p, format="mooncake", skip_bad=True)) == 3


# -- ShareGPT ---------------------------------------------------------------------------------
def conversation(cid: str, turns: list[tuple[str, str]]) -> dict:
    return {"id": cid, "conversations": [
        m for human, gpt in turns for m in ({"from": "human", "value": human}, {"from": "gpt", "value": gpt})
    ]}


def test_sharegpt_turns_share_their_conversation_prefix(tmp_path):
    long = "word " * 200  # ~250 estimated tokens: several 16-token blocks
    data = [conversation("c1", [(long, long), ("and then?", "done")]), conversation("c2", [(long, "ok")]),
            conversation("c3", [("something else " * 50, "x")])]
    p = write(tmp_path, "s.json", json.dumps(data, indent=1))
    assert sniff(str(p)) == "sharegpt"
    w = load_trace(p)
    assert w.estimated_tokens
    assert list(w.session) == ["c1", "c1", "c2", "c3"] and w.turn.tolist() == [0, 1, 0, 0]
    t0, t1, same_opening, other = (w.hash_ids[i] for i in range(4))
    full0 = w.prompt_tokens[0] // w.block_tokens
    assert t1[:full0] == t0[:full0]  # turn 2 re-sends turn 1's prompt: same leading blocks
    assert len(set(t1[full0 + 1:]) & set(t0)) == 0
    assert w.prompt_tokens[1] > w.prompt_tokens[0] + w.output_tokens[0]
    assert same_opening == t0  # c2's first prompt is c1's first prompt
    assert not set(other) & set(t0)  # a conversation that opens differently shares nothing
    assert len(t0) == -(-w.prompt_tokens[0] // w.block_tokens)


def test_openai_log_shared_system_prompt_is_prefix_reuse(tmp_path):
    system = {"role": "system", "content": "You are a helpful assistant. " * 20}
    rows = [{"timestamp": i, "request": {"messages": [system, {"role": "user", "content": f"question {i}" * 30}],
                                         "max_tokens": 10}} for i in range(3)]
    w = load_trace(write(tmp_path, "o.jsonl", jsonl(rows)))
    sys_blocks = (5 + 150) // w.block_tokens  # the system message's full blocks (600 chars / 4 + framing)
    assert w.hash_ids[0][:sys_blocks] == w.hash_ids[1][:sys_blocks] == w.hash_ids[2][:sys_blocks]
    assert w.hash_ids[0][sys_blocks + 1:] != w.hash_ids[1][sys_blocks + 1:]


def test_sharegpt_bad_record_has_its_line(tmp_path):
    data = [conversation("c1", [("hi", "hello")]), {"id": "c2", "text": "no conversations here"}]
    p = write(tmp_path, "s.json", json.dumps(data, indent=1))
    line = next(i for i, x in enumerate(p.read_text().splitlines(), 1) if '"id": "c2"' in x) - 1
    with pytest.raises(InputError) as err:
        load_trace(p)
    assert str(err.value) == f"{p}:{line}: missing column: no conversations (or messages) list {HINT}"
    assert len(load_trace(p, skip_bad=True)) == 1


# -- vLLM bench custom ------------------------------------------------------------------------
def test_vllm_bench_estimates_chinese_prompt_tokens(tmp_path):
    rows = [{"prompt": "你好" * 70, "output_tokens": 256}, {"prompt": "abcd" * 25, "output_tokens": 8}]
    w = load_trace(write(tmp_path, "v.jsonl", jsonl(rows)))
    # 140 Chinese characters at 1.4 per token; 100 Latin letters at 4 per token
    assert w.prompt_tokens.tolist() == [100, 25]
    assert w.output_tokens.tolist() == [256, 8]
    assert w.estimated_tokens and w.span_s == 0.0


def test_vllm_bench_missing_prompt(tmp_path):
    p = write(tmp_path, "v.jsonl", jsonl([{"prompt": "x", "output_tokens": 1}, {"output_tokens": 3}]))
    with pytest.raises(InputError) as err:
        load_trace(p, format="vllm-bench")
    assert str(err.value) == f"{p}:2: missing column: no prompt {HINT}"


def test_missing_tokenizer_folder_is_an_input_error(tmp_path):
    p = write(tmp_path, "v.jsonl", jsonl([{"prompt": "x", "output_tokens": 1}]))
    with pytest.raises(InputError, match="tokenizer folder not found"):
        load_trace(p, tokenizer=str(tmp_path / "nope"))


# -- OpenAI-style logs ------------------------------------------------------------------------
def test_openai_log_uses_usage_when_logged_and_estimates_otherwise(tmp_path):
    rows = [
        {"timestamp": "2024-05-01T10:00:00Z", "session_id": "u1",
         "request": {"messages": [{"role": "user", "content": "hi"}]},
         "response": {"usage": {"prompt_tokens": 812, "completion_tokens": 97}}},
        {"timestamp": "2024-05-01T10:00:02.5Z", "session_id": "u1",
         "request": {"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 64}},
    ]
    w = load_trace(write(tmp_path, "o.jsonl", jsonl(rows)))
    assert w.arrival_s.tolist() == [0.0, 2.5]
    assert w.prompt_tokens[0] == 812 and w.output_tokens.tolist() == [97, 64]
    assert w.prompt_tokens[1] == 5 + 10 + 3  # one message framed: 40 chars/4 + 5 framing + 3 primer
    assert w.estimated_tokens and w.turn.tolist() == [0, 1]


def test_openai_log_exact_when_every_row_has_usage(tmp_path):
    rows = [{"created": 1714557600 + i, "usage": {"prompt_tokens": 10 + i, "completion_tokens": 5}} for i in range(3)]
    w = load_trace(write(tmp_path, "o.jsonl", jsonl(rows)), format="openai-log")
    assert not w.estimated_tokens and w.arrival_s.tolist() == [0.0, 1.0, 2.0]


def test_openai_log_bad_rows(tmp_path):
    good = {"timestamp": 1714557600.0, "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    p = write(tmp_path, "o.jsonl", jsonl([good, {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}]))
    with pytest.raises(InputError, match=r"o\.jsonl:2: missing column: no timestamp"):
        load_trace(p, format="openai-log")
    p = write(tmp_path, "p.jsonl", jsonl([good, good | {"usage": {"prompt_tokens": -4, "completion_tokens": 1}}]))
    with pytest.raises(InputError, match=r"p\.jsonl:2: negative length: usage\.prompt_tokens is -4"):
        load_trace(p, format="openai-log")


# -- generic ----------------------------------------------------------------------------------
def test_generic_csv_with_mapping_and_ms(tmp_path):
    p = write(tmp_path, "g.csv", "ts,in_len,out_len,conv\n1000,10,5,a\n3500,20,6,b\n")
    w = load_trace(p, mapping={"arrival": "ts", "prompt_tokens": "in_len", "output_tokens": "out_len",
                               "session": "conv", "time_unit": "ms"})
    assert w.arrival_s.tolist() == [0.0, 2.5] and list(w.session) == ["a", "b"]


def test_generic_jsonl_dotted_keys_and_errors(tmp_path):
    rows = [{"t": 5, "u": {"p": 3, "c": 4}}, {"t": 6, "u": {"p": "lots", "c": 4}}]
    p = write(tmp_path, "g.jsonl", jsonl(rows))
    mapping = {"arrival": "t", "prompt_tokens": "u.p", "output_tokens": "u.c"}
    with pytest.raises(InputError) as err:
        load_trace(p, mapping=mapping)
    assert str(err.value) == f"{p}:2: unparseable number: u.p is 'lots' {HINT}"
    with pytest.raises(InputError, match="unknown mapping key"):
        load_trace(p, mapping=mapping | {"colour": "x"})
    with pytest.raises(InputError, match=r"g\.jsonl:1: missing column 'u.q'"):
        load_trace(p, mapping=mapping | {"prompt_tokens": "u.q"})


# -- sniffing and whole-file errors -----------------------------------------------------------
def test_sniff_picks_each_format(tmp_path):
    cases = {
        "azure": ("a.csv", AZURE_GOOD),
        "burstgpt": ("b.csv", BURST),
        "mooncake": ("m.jsonl", jsonl(MOON)),
        "vllm-bench": ("v.jsonl", jsonl([{"prompt": "x", "output_tokens": 1}])),
        "openai-log": ("o.jsonl", jsonl([{"timestamp": 1, "request": {"prompt": "x"}}])),
        "sharegpt": ("s.jsonl", jsonl([conversation("c", [("a", "b")])])),
    }
    for fmt, (name, text) in cases.items():
        assert sniff(str(write(tmp_path, name, text))) == fmt


def test_whole_file_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_trace(tmp_path / "absent.csv")
    with pytest.raises(InputError, match="empty file"):
        load_trace(write(tmp_path, "e.csv", "\n\n"))
    with pytest.raises(InputError, match="cannot tell the format"):
        load_trace(write(tmp_path, "x.csv", "a,b\n1,2\n"))
    with pytest.raises(InputError, match="unknown trace format 'parquet'"):
        load_trace(write(tmp_path, "y.csv", AZURE_GOOD), format="parquet")
    with pytest.raises(InputError, match="no requests in the file"):
        load_trace(write(tmp_path, "h.csv", AZURE_HEAD))


def test_tokenizer_folder_without_tokenizer_libraries_falls_back_to_labelled_estimate(tmp_path):
    try:
        import tokenizers  # noqa: F401
        pytest.skip("tokenizers is installed: counts would be exact")
    except ImportError:
        pass
    try:
        import transformers  # noqa: F401
        pytest.skip("transformers is installed: counts would be exact")
    except ImportError:
        pass
    folder = tmp_path / "model"
    folder.mkdir()
    p = write(tmp_path, "v.jsonl", jsonl([{"prompt": "abcd" * 4, "output_tokens": 1}]))
    w = load_trace(p, tokenizer=str(folder))
    assert w.estimated_tokens and w.prompt_tokens.tolist() == [4]
    assert any("token counts estimated" in n for n in w.notes)


def test_a_deeply_nested_first_line_is_one_line_of_bad_input_not_a_recursion_error(tmp_path):
    from tuner.core.errors import InputError
    from tuner.traffic import sniff

    path = tmp_path / "deep.jsonl"
    path.write_text('{"a":' * 10000 + "1" + "}" * 10000 + "\n")  # fits in the sniffed head, nests past the limit
    with pytest.raises(InputError) as err:
        sniff(str(path))
    assert f"{path}:1:" in str(err.value) and "\n" not in str(err.value)

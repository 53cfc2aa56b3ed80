"""The real traces tuner ships (tuner/data/traces): `tuner trace stats` agrees
with the README beside the files; conversion to the tuner's JSONL is lossless;
fingerprints are stable and content-sensitive."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from trace_data import AZURE_CONV as AZURE
from trace_data import MOONCAKE

from tuner.cli import main
from tuner.traffic import load_trace, native, trace_stats


def run(*args: str) -> int:
    """`tuner ARGS` in-process; its exit code."""
    try:
        main(list(args))
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def cli_json(capsys, *args: str) -> dict:
    assert run("trace", "stats", *args, "--output", "json") == 0
    return json.loads(capsys.readouterr().out)


def test_azure_stats_match_readme(capsys):
    s = cli_json(capsys, str(AZURE))
    # README.txt: 19,366 rows; span 3,501.7 s; mean 5.53 req/s; dispersion 1.39;
    # input mean 1154.7 / p50 1020 / p95 4083 / max 14050; output mean 211.1 / p50 129 / p95 451 / max 1000
    assert s["count"] == 19366
    assert s["span_s"] == pytest.approx(3501.7, abs=0.05)
    assert s["mean_rate_rps"] == pytest.approx(5.53, abs=0.005)
    assert s["burstiness"] == pytest.approx(1.39, abs=0.005)
    assert s["input_tokens"] == pytest.approx({"mean": 1154.7, "p50": 1020, "p95": 4083, "max": 14050}, abs=0.05)
    assert s["output_tokens"] == pytest.approx({"mean": 211.1, "p50": 129, "p95": 451, "max": 1000}, abs=0.05)
    assert s["prefix_reuse"] is None and s["sessions"] is None and not s["estimated_tokens"]


def test_mooncake_ideal_prefix_hit_ratio_matches_readme(capsys):
    s = cli_json(capsys, str(MOONCAKE))
    # README.txt: 3,993 rows, span 1,022.0 s, input mean 15325, ideal prefix block hit ratio 64.0 %
    assert s["count"] == 3993
    assert s["span_s"] == pytest.approx(1022.0, abs=0.05)
    assert s["input_tokens"]["mean"] == pytest.approx(15325, abs=0.5)
    assert round(100 * s["prefix_reuse"], 1) == 64.0
    assert s["block_tokens"] == 512


def test_stats_table_prints(capsys):
    assert run("trace", "stats", str(AZURE)) == 0
    out = capsys.readouterr().out
    assert "19,366" in out and "3,501.7 s" in out


def assert_same(a, b, *, converted_from: str | None = None) -> None:
    """``a`` holds ``b``'s requests and flags; ``a`` read from a converted file has that
    file as its source and ``b``'s origin as its first note."""
    assert a.fingerprint() == b.fingerprint()
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert np.array_equal(a.output_tokens, b.output_tokens)
    assert (a.session is None) == (b.session is None) and list(a.session or []) == list(b.session or [])
    assert (a.turn is None) == (b.turn is None)
    assert [tuple(x) for x in a.hash_ids or []] == [tuple(x) for x in b.hash_ids or []]
    notes = b.notes if converted_from is None else (f"converted from {converted_from}", *b.notes)
    assert (a.block_tokens, a.estimated_tokens, a.notes) == (b.block_tokens, b.estimated_tokens, notes)


@pytest.mark.parametrize("trace", [AZURE, MOONCAKE], ids=["azure", "mooncake"])
def test_convert_reads_back_losslessly(tmp_path, capsys, trace):
    out = tmp_path / "w.jsonl"
    assert run("trace", "convert", str(trace), str(out)) == 0
    back = load_trace(out)
    assert_same(back, load_trace(trace), converted_from=str(trace))
    assert back.source == str(out)  # the file replayed, never the log behind it


def test_native_round_trip_keeps_sessions_notes_and_flags(tmp_path):
    from tuner.traffic import article_mix

    w = article_mix(50, rate=3.0, seed=4)
    w = replace(w, session=[None if i % 7 == 0 else f"s{i % 5}" for i in range(50)],
                turn=np.arange(50) % 3, hash_ids=[tuple(range(i % 4)) for i in range(50)], block_tokens=64)
    back = load_trace(native.write(w, tmp_path / "n.jsonl"))
    assert_same(back, w, converted_from=w.source)
    again = load_trace(native.write(back, tmp_path / "again.jsonl"))  # converted twice: one origin, the first
    assert_same(again, back)
    assert again.source == str(tmp_path / "again.jsonl")


def test_a_file_converted_before_origin_was_named_is_its_own_source(tmp_path):
    from tuner.traffic import article_mix

    path = native.write(article_mix(5, seed=1), tmp_path / "old.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["source"] = str(tmp_path / "the-log.csv")  # what tuner trace convert wrote before
    del header["origin"]
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    back = load_trace(path)
    assert back.source == str(path)
    assert back.notes[0] == f"converted from {tmp_path / 'the-log.csv'}"


def test_fingerprint_stable_and_content_sensitive(tmp_path):
    a = load_trace(AZURE)
    copy = tmp_path / "renamed.csv"
    copy.write_bytes(AZURE.read_bytes())
    assert load_trace(copy).fingerprint() == a.fingerprint()  # same content, other path
    lines = AZURE.read_text().splitlines(keepends=True)
    ts, ctx, gen = lines[100].rstrip("\n").split(",")
    lines[100] = f"{ts},{int(ctx) + 1},{gen}\n"
    copy.write_text("".join(lines))
    assert load_trace(copy).fingerprint() != a.fingerprint()  # one token more in one request


def test_stats_on_skip_bad_reports_skips(tmp_path, capsys):
    lines = AZURE.read_text().splitlines(keepends=True)
    lines[10] = lines[10].replace(",", ",-", 1)
    bad = tmp_path / "bad.csv"
    bad.write_text("".join(lines))
    assert run("trace", "stats", str(bad)) == 2
    assert f"{bad}:11: negative length" in capsys.readouterr().err
    s = cli_json(capsys, str(bad), "--skip-bad")
    assert s["count"] == 19365
    assert s["notes"] == ["skipped 1 bad rows: 1 negative length (first at line 11)"]
    assert trace_stats(load_trace(bad, skip_bad=True))["count"] == 19365


def test_convert_shapes_on_the_way(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    assert run("trace", "convert", str(AZURE), str(out), "--start", "60", "--end", "1860",
               "--sample", "500", "--multiplier", "2", "--max-model-len", "4096") == 0
    printed = capsys.readouterr().out
    w = load_trace(out)
    assert len(w) == 500 and w.span_s < 900.0
    assert "truncated" in printed and np.all(w.prompt_tokens + w.output_tokens <= 4096)
    assert [n.split()[0] for n in w.notes] == ["converted", "window", "sampled", "rate", "truncated"]

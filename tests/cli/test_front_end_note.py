"""``tuner estimate`` says when vLLM's API server, not the GPU, sets a load's pace, and what lifts it."""
from __future__ import annotations

import re

from cli_runner import run_cli

DECODE = ["estimate", "--gpu", "H200", "--vllm-version", "0.26.0", "--input-len", "128", "--output-len", "512",
          "-n", "512"]


def test_a_load_the_api_server_caps_gets_a_note_that_names_the_knob(capsys):
    code, out, _ = run_cli([*DECODE, "-c", "8,256"], capsys)
    notes = [ln for ln in out.splitlines() if "API server" in ln]
    assert code == 0 and len(notes) == 1
    # the H200 profile's 72 us a token: at most 13,9xx output tokens/s from one process; 8 users are far below
    assert re.search(r"at concurrency 256 the API server streams [\d,]+ of the 13,[89]\d\d output tokens/s", notes[0])
    assert "--api-server-count 4" in notes[0]
    rows = {int(ln.split()[0]): ln.split() for ln in out.splitlines() if re.match(r"\s+\d+\s+\d+ms", ln)}
    assert float(rows[256][-2]) >= 0.9 * 13_891 > float(rows[8][-2])


def test_four_api_servers_lift_the_cap_and_the_note_goes(capsys):
    code, one, _ = run_cli([*DECODE, "-c", "256", "--output", "json"], capsys)
    code4, four, _ = run_cli([*DECODE, "-c", "256", "--api-server-count", "4"], capsys)
    assert code == code4 == 0 and "API server" not in four
    import json

    before = json.loads(one)["load"][0]["output_tokens_per_s"]
    after = float(next(ln for ln in four.splitlines() if re.match(r"\s+256\s", ln)).split()[-2])
    assert after > 1.2 * before


def test_a_vllm_line_without_the_flag_is_told_which_line_has_it(capsys):
    code, out, _ = run_cli(["estimate", "--gpu", "H200", "--vllm-version", "0.8.5", "--input-len", "128",
                            "--output-len", "512", "-n", "512", "-c", "256"], capsys)
    notes = [ln for ln in out.splitlines() if "API server" in ln]
    assert code == 0
    # no fitted profile for 0.8.5: the class table's 60 us a token, and no flag to suggest
    assert len(notes) == 1 and "16,667 output tokens/s it can (60 us a token" in notes[0]
    assert "vLLM 0.9.0 and later can run more of them" in notes[0] and "--api-server-count 4" not in notes[0]


def _decode_heavy(folder) -> None:
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16T18:00:{i // 20:02d}.{(i % 20) * 50:03d},128,512" for i in range(1000)]
    (folder / "decode.csv").write_text("\n".join(rows) + "\n")
    (folder / "space.yaml").write_text("name: decode-heavy\ndeployment: {model: qwen2.5-7b, gpu: H200, gpus: 1}\n"
                                       "workload: {target_ttft_s: 2s, requests: 1000}\n"
                                       "parameters:\n  max_num_seqs: {choices: [256]}\nlayouts: [tp1x1]\n")


def test_a_recommendation_the_api_server_caps_says_so_and_four_lift_it(tmp_path, capsys, monkeypatch):
    import json

    _decode_heavy(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["search", "--space", "space.yaml", "--trace", "decode.csv", "--budget", "1", "--sampler", "grid",
            "--confirm", "0", "--output", "json"]
    code, out, _ = run_cli(args, capsys)
    best = json.loads(out)["best"]
    assert code == 0 and best["front_end_note"].startswith(f"at {best['load']} the API server streams")
    assert "--api-server-count 4" in best["front_end_note"]
    code, out, _ = run_cli([*args, "--api-server-count", "4"], capsys)
    four = json.loads(out)["best"]
    assert code == 0 and four["front_end_note"] is None and "--api-server-count 4" in four["command"]
    assert four["tokens_per_s"] > 1.2 * best["tokens_per_s"]


def test_the_note_is_never_a_failure(tmp_path):
    """A run on real vLLM may never have read its profile: one that cannot be read gives no note,
    not an error at the end of a study; nor does a load far under the cap."""
    from tuner.search.recipe import front_end_note
    from tuner.serving.config import Deployment, ServeConfig

    broken = tmp_path / "profile.yaml"
    broken.write_text("frontend_per_token_s: [\n")
    assert front_end_note(Deployment(gpu="H200", vllm_version="0.26.0", calibration=str(broken)), ServeConfig(),
                          20_000.0, "at 256 users") is None
    plain = Deployment(gpu="H200", vllm_version="0.26.0")
    assert front_end_note(plain, ServeConfig(), 5_000.0, "at 32 users") is None
    assert front_end_note(plain, ServeConfig(), None, "at its load") is None
    assert "13,000 of the 13,891" in front_end_note(plain, ServeConfig(), 13_000.0, "at 256 users")

"""``tuner search --backend endpoint``: the API key's way in (--api-key-file, the
environment), where it never goes (the study, the output), and the failed requests that
``tuner search`` and ``tuner studies show`` report."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli
from pg_db import pg_url  # noqa: F401  (fixture)

BAD = Path(__file__).resolve().parents[1] / "replay" / "bad_server.py"
KEY = "sk-cli-test-5b1e0c77"
SPACE = """\
name: ep
deployment: {model: qwen2.5-7b, gpu: H100-SXM, gpus: 1}
workload: {target_ttft_s: 2s, requests: 16}
parameters:
  max_num_seqs: {choices: [8, 16]}
  max_model_len: 4096
layouts: [tp1x1]
"""


@pytest.fixture
def server(request):
    """bad_server.py with the flags given by indirect parametrisation; its base URL."""
    from tuner.backends.local_server import free_port, start_local_server

    port = free_port()
    proc, url = start_local_server([sys.executable, str(BAD), "--port", str(port), *request.param],
                                   port, what="bad server")
    try:
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    (tmp_path / "space.yaml").write_text(SPACE)
    return tmp_path


def _search(url: str, *extra: str) -> list[str]:
    return ["search", "--space", "space.yaml", "--backend", "endpoint", "--endpoint", url, "--sampler", "grid",
            "--budget", "1", "--output", "json", *extra]


def _study_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("server", [("--key", KEY)], indirect=True, ids=["key"])
def test_the_key_from_a_file_or_the_environment_reaches_the_endpoint_and_nothing_else(here, server, capsys,
                                                                                      monkeypatch):
    code, out, err = run_cli(_search(server), capsys)
    assert code == 2 and err.count("\n") == 1 and "answered 401" in err and "--api-key-file" in err
    assert not (here / "studies").exists()  # refused before a study was written
    (here / "key.txt").write_text(KEY + "\n")
    code, out, err = run_cli(_search(server, "--api-key-file", "key.txt"), capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["best"]["errors"] == {} and report["errors_total"] == {}
    (here / "key.txt").unlink()
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    code, out, err = run_cli([*_search(server), "--budget", "2"], capsys)
    assert code == 0, err
    code, shown, _ = run_cli(["studies", "show", report["study"]], capsys)
    assert code == 0 and "best feasible trial" in shown
    assert KEY not in out + err + shown and KEY.encode() not in _study_bytes(here)


def test_api_key_file_is_only_for_the_endpoint_backend(here, capsys):
    (here / "key.txt").write_text("sk-x\n")
    code, _, err = run_cli(["search", "--budget", "1", "--api-key-file", "key.txt"], capsys)
    assert code == 2 and "--api-key-file is for --backend endpoint" in err
    code, _, err = run_cli(_search("http://127.0.0.1:9", "--api-key-file", "missing.txt"), capsys)
    assert code == 2 and "cannot read the API key file missing.txt" in err


@pytest.mark.parametrize("server", [("--mode", "http_500")], indirect=True, ids=["http_500"])
def test_failed_requests_are_shown_by_search_and_studies_show(here, server, capsys):
    code, out, err = run_cli([*_search(server), "--budget", "2"], capsys)
    assert code == 3 and "http_500 x" in err and "nan" not in err
    report = json.loads(out)
    assert set(report["closest_miss_errors"]) == {"http_500"} and report["errors_total"]["http_500"] >= 2
    code, shown, _ = run_cli(["studies", "show", report["study"]], capsys)
    assert code == 0 and "failed requests over all trials: http_500 x" in shown
    assert "its failed requests: http_500 x" in shown and "internal server error" in shown
    code, shown, _ = run_cli(["studies", "show", report["study"], "--output", "json"], capsys)
    info = json.loads(shown)
    assert info["errors_total"] == report["errors_total"] and "http_500" in info["closest_miss"]


@pytest.mark.postgres
def test_a_storage_password_is_masked_in_the_output(here, capsys, pg_url):  # noqa: F811
    password = pg_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    code, out, err = run_cli(["search", "--budget", "1", "--storage", pg_url, "--study", "pw", "--output", "json"],
                             capsys)
    assert code == 0, err
    assert json.loads(out)["storage"].startswith("postgresql://***@")
    code, text, _ = run_cli(["search", "--budget", "1", "--storage", pg_url, "--study", "pw"], capsys)
    code2, listing, _ = run_cli(["studies", "--storage", pg_url], capsys)
    assert code == code2 == 0 and f":{password}@" not in out + err + text + listing

"""A --storage that cannot be read is one line (exit 2) in every command that takes one,
the line tuner search gives; never a traceback."""
from __future__ import annotations

import pytest
from cli_runner import run_cli

READERS = [["studies"], ["studies", "show", "x"], ["report"], ["plan"], ["export"]]


@pytest.mark.parametrize("argv", [["search", "--budget", "1"], *READERS], ids=lambda a: " ".join(a))
def test_a_url_no_driver_reads_is_the_same_line_everywhere(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli([*argv, "--storage", "foo://x"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err == ("tuner: cannot open study storage 'foo://x': Can't load plugin: sqlalchemy.dialects:foo "
                   "(check the URL, the server and the credentials)\n")


@pytest.mark.parametrize("argv", READERS, ids=lambda a: " ".join(a))
def test_a_sqlite_file_that_does_not_exist_is_named_and_not_created(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli([*argv, "--storage", "sqlite:///typo.db"], capsys)
    assert code == 2 and err.startswith("tuner: no study database at typo.db (") and err.count("\n") == 1
    assert not (tmp_path / "typo.db").exists()


@pytest.mark.parametrize("argv", READERS, ids=lambda a: " ".join(a))
def test_a_database_server_that_is_not_there_is_one_line_without_the_password(argv, tmp_path, monkeypatch,
                                                                              capsys):
    pytest.importorskip("psycopg2")
    monkeypatch.chdir(tmp_path)
    url = "postgresql://tuner:pw-42-secret@127.0.0.1:1/tuner"  # port 1: nothing listens there
    code, _, err = run_cli([*argv, "--storage", url], capsys)
    assert code == 2 and err.count("\n") == 1 and "pw-42-secret" not in err
    assert err.startswith("tuner: cannot open study storage 'postgresql://***@127.0.0.1:1/tuner': ")
    assert "refused" in err and err.endswith("(check the URL, the server and the credentials)\n")

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


ALL = [["search", "--budget", "1"], *READERS]


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv", ALL, ids=lambda a: " ".join(a))
def test_a_database_server_that_is_not_there_is_said_so_with_the_password_masked(argv, tmp_path, monkeypatch,
                                                                                   capsys):
    """Nothing was ever reached: no word of a server that went away nor of trials kept."""
    pytest.importorskip("psycopg2")
    monkeypatch.chdir(tmp_path)
    port = _closed_port()
    url = f"postgresql://tuner:pw-42-secret@127.0.0.1:{port}/tuner"
    code, out, err = run_cli([*argv, "--storage", url], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "pw-42-secret" not in err
    assert err.startswith(f"tuner: cannot reach the study database postgresql://***@127.0.0.1:{port}/tuner: "
                          f"connection refused by 127.0.0.1:{port} (no server listens there)"), err
    assert "went away" not in err and "kept" not in err and "nothing was read or written" in err


@pytest.mark.parametrize("argv", ALL, ids=lambda a: " ".join(a))
def test_a_database_host_that_does_not_resolve_is_named(argv, tmp_path, monkeypatch, capsys):
    pytest.importorskip("psycopg2")
    monkeypatch.chdir(tmp_path)
    url = "postgresql://tuner:pw-42-secret@no-such-host.invalid/tuner"  # .invalid never resolves (RFC 2606)
    code, _, err = run_cli([*argv, "--storage", url], capsys)
    assert code == 2 and err.count("\n") == 1 and "pw-42-secret" not in err, err
    assert err.startswith("tuner: cannot reach the study database postgresql://***@no-such-host.invalid/tuner: "
                          "unknown host 'no-such-host.invalid'"), err
    assert "went away" not in err and "kept" not in err


def test_a_server_that_answers_but_will_not_talk_is_told_apart_from_one_that_is_not_there(tmp_path, monkeypatch,
                                                                                            capsys):
    """Something listens on the port but hangs up (not PostgreSQL, or a proxy with no backend):
    the server was reached, so the line says what it answered, not 'refused'."""
    import socket
    import threading

    pytest.importorskip("psycopg2")
    monkeypatch.chdir(tmp_path)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def hang_up() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        code, _, err = run_cli(["search", "--budget", "1", "--storage",
                                f"postgresql://tuner:pw-42-secret@127.0.0.1:{port}/tuner"], capsys)
    finally:
        listener.close()
    assert code == 2 and err.count("\n") == 1 and "pw-42-secret" not in err, err
    assert err.startswith(f"tuner: the database server of postgresql://***@127.0.0.1:{port}/tuner answered but "
                          "the connection failed: "), err
    assert "refused" not in err and "went away" not in err and "kept" not in err


def test_a_database_without_its_driver_names_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["search", "--budget", "1", "--storage", "mysql://u:pw-42-secret@127.0.0.1/t"], capsys)
    assert code == 2 and err.count("\n") == 1 and "pw-42-secret" not in err, err
    assert err.startswith("tuner: cannot open study storage 'mysql://***@127.0.0.1/t': its database driver is "
                          "not installed"), err
    assert "went away" not in err


@pytest.mark.postgres
def test_credentials_the_server_refuses_are_said_so(tmp_path, monkeypatch, capsys):
    import os
    from urllib.parse import urlsplit, urlunsplit

    admin = os.environ.get("TUNER_TEST_POSTGRES_URL")
    if not admin:
        pytest.skip("TUNER_TEST_POSTGRES_URL is unset: .ci/run starts PostgreSQL (.ci/postgres.sh) and sets it")
    monkeypatch.chdir(tmp_path)
    parts = urlsplit(admin)
    url = urlunsplit(parts._replace(netloc=f"no_such_user:pw-42-secret@{parts.hostname}:{parts.port or 5432}"))
    code, _, err = run_cli(["search", "--budget", "1", "--storage", url], capsys)
    assert code == 2 and err.count("\n") == 1 and "pw-42-secret" not in err, err
    assert "answered but the connection failed" in err and "no_such_user" in err

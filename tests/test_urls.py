"""Credentials: masked in any text, taken out of URLs, read from a file or the environment."""
from __future__ import annotations

import base64

import pytest

from tuner.core.errors import InputError
from tuner.core.urls import read_api_key, redact, redact_value, split_credentials


@pytest.mark.parametrize(("text", "shown"), [
    ("http://me:sk-123@host:8000/v1 answered 401", "http://***@host:8000/v1 answered 401"),
    ("postgresql://tuner:pw@127.0.0.1:5432/db", "postgresql://***@127.0.0.1:5432/db"),
    ("https://h/v1?api_key=sk-123&x=1", "https://h/v1?api_key=***&x=1"),
    ("header Authorization: Bearer sk-abcdefgh123", "header Authorization: Bearer ***"),
    ("http://127.0.0.1:8000/v1/models", "http://127.0.0.1:8000/v1/models"),
])
def test_redact_masks_credentials_and_keeps_where(text, shown):
    assert redact(text) == shown and redact(shown) == shown


def test_redact_value_reaches_every_string():
    data = {"endpoints": ["http://a:b@h"], "n": 3, "deep": ({"u": "x?token=t"},)}
    assert redact_value(data) == {"endpoints": ["http://***@h"], "n": 3, "deep": ({"u": "x?token=***"},)}


def test_credentials_leave_the_url_for_the_header_they_meant():
    url, auth = split_credentials("http://me:p%40ss@host:8000/v1")
    assert url == "http://host:8000/v1" and base64.b64decode(auth.removeprefix("Basic ")) == b"me:p@ss"
    assert split_credentials("https://sk-token@h") == ("https://h", "Bearer sk-token")
    assert split_credentials("http://h:1") == ("http://h:1", None)


def test_the_key_comes_from_the_file_then_openai_then_vllm(tmp_path):
    key = tmp_path / "key"
    key.write_text("  sk-from-file \n")
    env = {"OPENAI_API_KEY": "sk-openai", "VLLM_API_KEY": "sk-vllm"}
    assert read_api_key(key, env) == "sk-from-file"
    assert read_api_key(None, env) == "sk-openai"
    assert read_api_key(None, {"VLLM_API_KEY": "sk-vllm", "OPENAI_API_KEY": " "}) == "sk-vllm"
    assert read_api_key(None, {}) is None


@pytest.mark.parametrize(("content", "words"), [
    (b"", "is empty"),
    (b"sk-one\nsk-two\n", "more than one word or line"),
    (b"sk-\xff\xfe", "not UTF-8"),
])
def test_a_bad_key_file_is_one_line_that_never_quotes_it(tmp_path, content, words):
    key = tmp_path / "key"
    key.write_bytes(content)
    with pytest.raises(InputError) as err:
        read_api_key(key, {})
    assert words in str(err.value) and str(key) in str(err.value) and "sk-" not in str(err.value)
    with pytest.raises(InputError, match="cannot read the API key file"):
        read_api_key(tmp_path / "missing", {})

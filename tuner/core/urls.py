"""Credentials never leave the process: :func:`redact` masks them in any text that is
stored (study attributes), printed (messages, logs) or written (reports).

A URL's ``user:password@`` part and the values of query parameters that carry secrets
(``api_key``, ``key``, ``token``, ``access_token``, ``password``, ``secret``, ``sig``...)
become ``***``; the rest of the URL stays, so the message still says where.

:func:`unreachable` says why a server URL (a study database) cannot be reached, found by
trying it (a name lookup, a TCP connection), so that a message names what happened.

An endpoint's API key comes from a file (``--api-key-file``) or the environment
(``OPENAI_API_KEY``, then ``VLLM_API_KEY``): :func:`read_api_key`. It is sent as
``Authorization: Bearer <key>`` and kept only in memory, never in a study, a log, a
report or a message. Credentials written into an endpoint URL (``http://user:key@host``)
are taken out of the URL (:func:`split_credentials`) and sent as a header too.
"""
from __future__ import annotations

import base64
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from tuner.core.errors import InputError

#: ``scheme://user:password@host`` or ``scheme://token@host``.
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s?#]+)@")
#: ``?api_key=...`` / ``&token=...`` (case-insensitive names).
_QUERY = re.compile(r"(?P<name>[?&](?:api[_-]?key|key|token|access[_-]?token|auth|password|passwd|pwd|secret|"
                    r"sig|signature|x-api-key)=)(?P<value>[^&#\s]+)", re.I)
#: ``Authorization: Bearer ...`` pasted into a message.
_BEARER = re.compile(r"(?P<name>\bBearer\s+)(?P<value>[A-Za-z0-9._~+/=-]{8,})")

MASK = "***"


def redact(text: str) -> str:
    """``text`` with every credential in it masked (idempotent)."""
    if not text:
        return text
    out = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", str(text))
    out = _QUERY.sub(lambda m: f"{m['name']}{MASK}", out)
    return _BEARER.sub(lambda m: f"{m['name']}{MASK}", out)


def has_credentials(url: str) -> bool:
    return redact(url) != url


def redact_value(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dicts, lists, tuples)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


#: Environment variables read for an endpoint's API key, in this order (``vllm bench
#: serve`` reads the first; ``vllm serve --api-key`` defaults to the second).
API_KEY_ENV = ("OPENAI_API_KEY", "VLLM_API_KEY")
#: A key file larger than this is not a key.
MAX_KEY_BYTES = 16 * 1024


def read_api_key(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key in ``path`` (one line; surrounding whitespace dropped), else the first
    of :data:`API_KEY_ENV` set in ``environ`` (default ``os.environ``), else ``None``.
    A bad file is an :class:`~tuner.core.errors.InputError` that never quotes its content."""

    if path is not None:
        p = Path(path).expanduser()
        try:
            if p.stat().st_size > MAX_KEY_BYTES:
                raise InputError(f"{p} is larger than {MAX_KEY_BYTES // 1024} KiB: not an API key file",
                                 hint="write the key alone on one line")
            raw = p.read_bytes()
        except OSError as err:
            raise InputError(f"cannot read the API key file {p}: {err.strerror or err}",
                             hint="give --api-key-file a readable file holding the key") from err
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise InputError(f"the API key file {p} is not UTF-8 text", hint="write the key alone on one line") from None  # noqa: E501
        if not key:
            raise InputError(f"the API key file {p} is empty", hint="write the key alone on one line")
        if any(c.isspace() for c in key) or not key.isprintable():
            raise InputError(f"the API key file {p} holds more than one word or line",
                             hint="write the key alone on one line")
        return key
    env = os.environ if environ is None else environ
    for name in API_KEY_ENV:
        value = (env.get(name) or "").strip()
        if value:
            return value
    return None


def split_credentials(url: str) -> tuple[str, str | None]:
    """``(url without its user:password@ part, the Authorization header value it meant)``:
    ``http://user:pw@host`` gives ``Basic`` credentials, ``http://TOKEN@host`` (no colon)
    a ``Bearer`` token. A URL without credentials comes back as it is, with ``None``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    if ":" in userinfo:
        user, password = (unquote(x) for x in userinfo.split(":", 1))
        return clean, "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return clean, f"Bearer {unquote(userinfo)}"


def bearer(key: str) -> dict[str, str]:
    """The request header that carries ``key``."""
    return {"Authorization": f"Bearer {key}"}


#: The port a database URL means when it names none (SQLAlchemy dialects' defaults).
DEFAULT_PORTS = {"postgresql": 5432, "postgres": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433, "oracle": 1521}


def unreachable(url: str, *, timeout_s: float = 3.0) -> str | None:
    """Why the server a URL names cannot be reached, found by trying it: the host's name
    looked up, then a TCP connection to its port (``unknown host 'db.example'``,
    ``connection refused by 10.0.0.5:5432 (no server listens there)``, ``no answer from
    10.0.0.5:5432 in 3 s``). None when a connection opens (the server is there: what it
    then says is its own answer), and for a URL with no host (a file, a Unix socket)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is no number: the driver says so itself
        return None
    port = port or DEFAULT_PORTS.get(parts.scheme.split("+")[0].lower())
    if not host or port is None:
        return None
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        return f"unknown host {host!r} ({err.strerror or 'no address for it'})"
    why = ""
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout_s)
                sock.connect(address)
            return None
        except ConnectionRefusedError:
            why = why or f"connection refused by {where} (no server listens there)"
        except TimeoutError:
            why = why or f"no answer from {where} in {timeout_s:g} s (the host is down, or a firewall drops it)"
        except OSError as err:
            why = why or f"cannot connect to {where}: {err.strerror or err}"
    return why or f"no address for {host!r}"


__all__ = ["API_KEY_ENV", "DEFAULT_PORTS", "MASK", "bearer", "has_credentials", "read_api_key", "redact",
           "redact_value", "split_credentials", "unreachable"]

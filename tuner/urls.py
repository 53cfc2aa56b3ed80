"""Credentials never leave the process: :func:`redact` masks them in any text that is
stored (study attributes), printed (messages, logs) or written (reports).

A URL's ``user:password@`` part and the values of query parameters that carry secrets
(``api_key``, ``key``, ``token``, ``access_token``, ``password``, ``secret``, ``sig``...)
become ``***``; the rest of the URL stays, so the message still says where.
"""
from __future__ import annotations

import re

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


__all__ = ["MASK", "has_credentials", "redact"]

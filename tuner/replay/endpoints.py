"""The servers a replay talks to: base URLs and their credentials (:func:`_endpoints`),
the model they serve (:func:`fetch_model`) and what to say when they refuse (:func:`_denied`)."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

from tuner.core.errors import BackendError, InputError
from tuner.core.urls import bearer, redact, split_credentials


async def fetch_model(session: aiohttp.ClientSession, base: str, headers: dict[str, str] | None = None) -> str:
    """The first model id ``/v1/models`` lists."""
    try:
        async with session.get(f"{base}/v1/models", headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            if resp.status in (401, 403):
                raise BackendError(f"{base}/v1/models answered {resp.status}: {_denied(headers)}")
            data = await resp.json()
        return str(data["data"][0]["id"])
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, IndexError, ValueError, TypeError) as err:
        raise BackendError(redact(
            f"cannot read the model name from {base}/v1/models ({type(err).__name__}: {err}); "
            "is the server up? pass model= to skip this"
        )) from err


def _denied(headers: dict[str, str] | None) -> str:
    """What to do about a 401/403."""
    if headers and "Authorization" in headers:
        return ("the server refused the credentials given (check the key in --api-key-file, OPENAI_API_KEY "
                "or VLLM_API_KEY, or the URL's)")
    return "the server wants an API key (give --api-key-file PATH, or set OPENAI_API_KEY or VLLM_API_KEY)"


def _normalise(endpoints: Sequence[str] | str) -> list[str]:
    """Base URLs (``http://host:port``, no ``/v1``, credentials taken out)."""
    return [u for u, _ in _endpoints(endpoints)]


def _endpoints(endpoints: Sequence[str] | str, api_key: str | None = None) -> list[tuple[str, dict[str, str]]]:
    """``(base URL, headers)`` per endpoint: the base without ``/v1`` and without the
    credentials a URL carried; the headers carry ``api_key`` as a bearer token, or else
    the URL's credentials (:func:`tuner.core.urls.split_credentials`)."""
    if isinstance(endpoints, str):
        endpoints = [endpoints]
    out = []
    for e in endpoints:
        e = str(e).strip()
        if not e.startswith(("http://", "https://")):
            raise InputError(f"endpoint {redact(e)!r} is not an http(s) URL", hint="write http://host:port")
        url, auth = split_credentials(e)
        if "?" in url or "#" in url:
            raise InputError(f"endpoint {redact(e)!r} has a query string",
                             hint="give the base URL (http://host:port); an API key goes in --api-key-file, "
                                  "OPENAI_API_KEY or VLLM_API_KEY")
        if auth is not None and api_key is not None:
            raise InputError(f"endpoint {redact(e)!r} carries credentials and an API key was given too",
                             hint="give one: take them out of the URL, or unset OPENAI_API_KEY/VLLM_API_KEY")
        headers = bearer(api_key) if api_key is not None else ({"Authorization": auth} if auth else {})
        out.append((url.rstrip("/").removesuffix("/v1").rstrip("/"), headers))
    return out

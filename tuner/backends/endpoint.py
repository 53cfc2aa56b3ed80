"""The ``endpoint`` backend: replay against servers someone else runs.

Nothing is started or stopped; one trial is one load against the given URLs (one per
replica). ``start`` only checks that every URL answers ``/v1/models`` and reads what
``/metrics`` tells about the KV cache; the ServeConfig is not applied (the operator owns
the server's flags), so a study with this backend sweeps loads, not configurations.

``api_key`` is sent to every URL as ``Authorization: Bearer <key>`` (credentials written
into a URL are taken out of it and sent as a header too). It lives only in this object:
``preflight`` checks it before any study is written (a 401 or 403 is one line naming the
URL, credentials masked), and nothing that is stored, logged or printed holds it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.backends.local_server import _http
from tuner.core.errors import BackendError, EndpointFault, InputError, connection_cause
from tuner.core.urls import redact
from tuner.replay.client import bad_stream_fault, replay
from tuner.replay.endpoints import _denied, _endpoints
from tuner.replay.metrics import parse_prometheus, snapshot
from tuner.runtime.control import StopHook

if TYPE_CHECKING:
    from tuner.serving.config import Deployment, ServeConfig
    from tuner.serving.load import Load
    from tuner.serving.result import RunResult
    from tuner.traffic.workload import Workload


class EndpointInstance:
    def __init__(self, backend: EndpointBackend, info: dict[str, Any]) -> None:
        self.backend = backend
        self.info = info

    def run(self, workload: Workload, load: Load, *, stop: StopHook | None = None) -> RunResult:

        import time

        # a fresh salt per run: the server outlives us, and a rerun must not hit an earlier run's prefix cache
        result = replay(self.backend.given, workload, load, model=self.info.get("model_name"), stop=stop,
                        salt=time.time_ns() % 2**31, api_key=self.backend._api_key, **self.backend._replay)
        bad = bad_stream_fault(result)
        if bad is not None:
            raise EndpointFault(bad[0], ", ".join(redact(u) for u in self.backend.urls), bad[1])
        errors = result.error_counts()
        if len(result) and not result.ok.any() and (errors.get("disconnect") or errors.get("timeout")):
            # nothing served and connections failed: a server that went away is the server's fault
            for url, headers in zip(self.backend.urls, self.backend._headers):
                self.backend._models(url, headers)  # EndpointFault when it no longer answers
        if "num_gpu_blocks" in self.info:
            result.server.setdefault("num_gpu_blocks", self.info["num_gpu_blocks"])
        return result

    def close(self) -> None:
        """Nothing to stop: the servers belong to someone else."""

    def __enter__(self) -> EndpointInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EndpointBackend:
    """``EndpointBackend(urls, model=None, router="round_robin", timeout_s=600, api="completions",
    metrics=True, api_key=None)``; ``urls`` are base URLs (``http://host:8000``), one per
    replica; ``urls`` holds them without credentials."""

    name = "endpoint"
    restarts = False  # the operator owns the server's flags
    measures_gpu_time = True
    simulated = False
    time_scale = 1.0
    launched_at: float | None = None  # it launches no server

    def __init__(
        self,
        urls: list[str] | tuple[str, ...] | str,
        *,
        model: str | None = None,
        router: str = "round_robin",
        timeout_s: float = 600.0,
        api: str = "completions",
        metrics: bool = True,
        api_key: str | None = None,
    ) -> None:

        self.given = [urls] if isinstance(urls, str) else list(urls)
        endpoints = _endpoints(self.given, api_key)
        self.urls = [u for u, _ in endpoints]
        self._headers = [h for _, h in endpoints]
        self._api_key = api_key
        if not self.urls:
            raise InputError("the endpoint backend needs at least one URL", hint="pass --endpoint http://host:8000")
        self.model = model
        self._probe_s = 10.0  # seconds /v1/models may take to answer
        self._replay = {"router": router, "timeout_s": timeout_s, "api": api, "metrics": metrics}

    def __repr__(self) -> str:
        return f"EndpointBackend({self.urls!r})"

    def precheck(self, deployment: Deployment, config: ServeConfig) -> dict[str, Any]:
        return {}

    def preflight(self, deployment: Deployment) -> None:
        """Before any study is written: every URL answers ``/v1/models`` and takes the
        credentials (:class:`InputError` for a 401/403, :class:`BackendError` when a URL
        does not answer)."""
        for url, headers in zip(self.urls, self._headers):
            self._models(url, headers)

    def _models(self, url: str, headers: dict[str, str]) -> dict[str, Any]:
        """The first model card ``url/v1/models`` lists; :class:`EndpointFault` when the
        URL refuses, resets or does not answer in time."""
        import http.client
        import json

        try:
            status, body = _http(f"{url}/v1/models", timeout=self._probe_s, headers=headers)
        except (OSError, http.client.HTTPException) as err:  # refused, reset, timed out, not HTTP
            kind, cause = connection_cause(err)
            raise EndpointFault(kind, redact(f"{url}/v1/models"), cause) from None
        if status in (401, 403):
            raise InputError(redact(f"{url}/v1/models answered {status}: {_denied(headers)}"))
        try:
            card = json.loads(body)["data"][0] if status == 200 else None
            model = str(card["id"]) if isinstance(card, dict) else None
        except (ValueError, KeyError, IndexError, TypeError):
            model = None
        if model is None:
            raise BackendError(redact(f"{url}/v1/models did not answer with a model list (HTTP {status}); is the "
                                      "server up and is the URL right?"))
        return card

    def start(self, deployment: Deployment, config: ServeConfig) -> EndpointInstance:

        model = self.model
        info: dict[str, Any] = {"startup_s": 0.0, "endpoints": [redact(u) for u in self.urls], "argv": [],
                                "log_paths": []}
        for url, headers in zip(self.urls, self._headers):
            card = self._models(url, headers)
            model = model or str(card["id"])
            if card.get("max_model_len"):
                info.setdefault("max_model_len", int(card["max_model_len"]))
            try:
                status, body = _http(f"{url}/metrics", timeout=10.0, headers=headers)
            except OSError:
                continue
            if status == 200:
                snap = snapshot(parse_prometheus(body.decode("utf-8", "replace")))
                if "num_gpu_blocks" in snap:
                    info["num_gpu_blocks"] = int(snap["num_gpu_blocks"])
        info["model_name"] = model
        return EndpointInstance(self, info)

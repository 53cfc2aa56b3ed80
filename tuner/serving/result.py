"""What one run measures, per request and in aggregate, with ``vllm bench serve``'s
definitions (docs/metrics.md): TTFT is the request's start (just before the POST) →
first content chunk; TPOT = (E2E − TTFT)/(output − 1), excluding the first token, only
for outputs longer than one token; ITL is the gap between content chunks; throughput
divides by the run's duration (its wall time, from the first request issued to the
last one ended).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from tuner.core.errors import InputError
from tuner.serving.load import Concurrency, Poisson, parse_load

PERCENTILES = (50, 90, 95, 99)
#: Error kinds of requests a stopped run never finished (never sent, or cancelled in
#: flight): what the stop did, not failures of the server.
UNFINISHED = ("not_sent", "cancelled")


class StartupInfo(TypedDict, total=False):
    """What a start found (``Instance.info``, :mod:`tuner.search.backend`). ``startup_s`` is always there; the rest
    where the backend knows it. The contract suite (:class:`tuner.testing.BackendContract`)
    checks that an instance reports no fact this does not name, so a new fact is declared
    here first, where every reader sees it."""

    startup_s: float                # seconds the start took, or would take on the GPU (>= 0)
    vllm_version: str
    model_name: str                 # the served model's id (what requests name)
    endpoints: list[str]            # the replicas' URLs (credentials masked where given)
    argv: list[Any]                 # each replica's command line ([] when none was started)
    log_paths: list[str]            # each replica's log file
    log_lines: list[str]            # the simulator's: the startup lines vLLM would log
    calibration: str                # the simulator's: the GPU class of its profile
    cuda_visible_devices: list[str]  # the vllm backend's: each replica's GPUs
    platform: str                   # the vllm backend's: what vLLM runs on (cuda, cpu)
    # from the startup log (tuner.backends.vllm_args.parse_startup; vllm_cpu's for the CPU
    # build) or from /metrics and the model card
    kv_cache_tokens: int            # "GPU KV cache size: N tokens"
    num_gpu_blocks: int
    max_concurrency: float          # "Maximum concurrency for N tokens per request: Xx"
    max_num_seqs: int
    max_model_len: int              # the model card's (endpoint)
    model_load_gib: float           # "Model loading took X GiB"
    graph_capture_s: float
    graph_capture_gib: float
    available_kv_gib: float         # "Available KV cache memory: X GiB"
    peak_activation_gib: float
    non_torch_gib: float
    cudagraph_gib: float
    host_memory_gib: float          # the CPU build's node memory


class ServerReadings(TypedDict, total=False):
    """What the server side said of one run (:attr:`RunResult.server`): vLLM's ``/metrics``
    polled during the replay (:class:`tuner.replay.metrics.MetricsPoller`), or the simulator's
    own counters. Every key is optional: a server without ``/metrics`` gives ``endpoints``
    alone. The backend contract (:class:`tuner.testing.BackendContract`) checks that no
    backend writes a key this does not name."""

    endpoints: list[str]                 # where the run was sent (credentials masked)
    metrics_samples: int                 # /metrics readings taken during the run
    metrics_failures: int                # readings that failed
    num_requests_running_max: float      # over the replicas, summed per reading
    num_requests_running_mean: float
    num_requests_waiting_max: float
    num_requests_waiting_mean: float
    kv_cache_usage_max: float            # share of the KV cache in use, 0-1
    kv_cache_usage_mean: float
    num_preemptions: float               # counter deltas over the run
    prefix_cache_queries: float
    prefix_cache_hits: float
    prefix_cache_hit_rate: float         # hits / queries (NaN when nothing was queried)
    num_gpu_blocks: int                  # the KV cache's blocks (the smallest replica's)
    kv_cache_tokens: int                 # tokens the KV cache holds (vLLM's "GPU KV cache size")
    replicas: int                        # the simulator's: replicas behind its router
    engine_steps: int                    # the simulator's: scheduler steps run


@dataclass(frozen=True, eq=False)
class RunResult:
    """Per-request columns (numpy arrays, one row per request offered) and run facts.

    ``error`` holds ``None`` for a good request or a short kind: ``http_<status>`` (an
    answer other than 200: ``http_429``, ``http_500``...), ``timeout`` (no complete answer
    within the request timeout), ``disconnect`` (the connection failed or closed mid-body),
    ``stream_error`` (a body that is not a well-formed stream: a line that is not SSE, a
    chunk that is not JSON or not a completion chunk, an error object mid-stream, no
    ``[DONE]``, token counts that do not add up), ``short_output`` (fewer output tokens
    than forced), and ``not_sent`` / ``cancelled`` for requests a stopped run never sent or
    cut (:data:`UNFINISHED`). ``error_detail`` holds the first message seen per kind.
    ``ttft_s``/``e2e_s`` are NaN for failed requests. ``ttft_kernel_s`` (the streaming
    client's) is tuner's closer reading of TTFT: from the request body handed to the
    socket to the kernel's receive stamp of the first chunk (no connection set-up, no
    client event-loop delay); ``summary()`` gives its aggregates as ``ttft_kernel_*``.
    ``itl_s`` is every inter-token gap of every request, flattened (may be ``None`` when
    not recorded). ``server`` holds
    server-side readings (``kv_cache_usage_max``, ``num_preemptions``,
    ``prefix_cache_hit_rate``, ``num_gpu_blocks``, ...). ``issue_s`` (the streaming
    client's) is when its scheduler started each request, in schedule order; ``send_s``
    is when the request started (vLLM's ``start_time``: just before the POST, so
    ``send_s + e2e_s`` is when it ended). Both are relative to the run's start; NaN for
    requests never sent.
    """

    send_s: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    error: list[str | None]
    duration_s: float
    queue_s: np.ndarray | None = None
    issue_s: np.ndarray | None = None
    cached_tokens: np.ndarray | None = None
    itl_s: np.ndarray | None = None
    ttft_kernel_s: np.ndarray | None = None
    server: ServerReadings = field(default_factory=dict)  # type: ignore[assignment]
    stopped_early: bool = False
    load_label: str = ""
    error_detail: dict[str, str] = field(default_factory=dict)
    #: The longest time with a stream mid-answer and no chunk on any (the streaming
    #: client's, :class:`tuner.replay.disruption.StallWatch`), when it began (seconds into
    #: the run) and how many streams were mid-answer then.
    stall_s: float = 0.0
    stall_at_s: float = 0.0
    stall_streams: int = 0

    def __len__(self) -> int:
        return len(self.send_s)

    @property
    def ok(self) -> np.ndarray:
        return np.array([e is None for e in self.error], dtype=bool)

    @property
    def tpot_s(self) -> np.ndarray:
        """Per request; NaN where output ≤ 1 token or the request failed."""
        out = self.output_tokens.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = (self.e2e_s - self.ttft_s) / (out - 1.0)
        tpot[(out <= 1) | ~self.ok] = np.nan
        return tpot

    def error_counts(self, *, unfinished: bool = False) -> dict[str, int]:
        """Failed requests per error kind, most first; the :data:`UNFINISHED` kinds of a
        stopped run only with ``unfinished``."""
        counts: dict[str, int] = {}
        for e in self.error:
            if e is not None and (unfinished or e not in UNFINISHED):
                counts[e] = counts.get(e, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def summary(self) -> dict[str, float]:
        """Flat dict of aggregates: ``ttft_mean_s``, ``ttft_p95_s``, ..., ``tokens_per_s``,
        and ``errors_<kind>`` (failed requests of each kind seen, :meth:`error_counts`)."""
        ok = self.ok
        n_ok = int(ok.sum())
        dur = self.duration_s if self.duration_s > 0 else float("nan")
        out: dict[str, float] = {
            "requests": float(len(self)),
            "completed": float(n_ok),
            "error_rate": float(1 - n_ok / len(self)) if len(self) else 0.0,
            "duration_s": float(self.duration_s),
            "requests_per_s": n_ok / dur,
            "output_tokens_per_s": float(self.output_tokens[ok].sum()) / dur,
            "tokens_per_s": float(self.output_tokens[ok].sum() + self.prompt_tokens[ok].sum()) / dur,
        }
        for kind, n in self.error_counts().items():
            out[f"errors_{kind}"] = float(n)
        columns = {"ttft": self.ttft_s[ok], "tpot": self.tpot_s[ok], "e2e": self.e2e_s[ok]}
        if self.itl_s is not None:
            columns["itl"] = self.itl_s
        if self.ttft_kernel_s is not None:
            columns["ttft_kernel"] = self.ttft_kernel_s[ok]
        if self.queue_s is not None:
            columns["queue"] = self.queue_s[ok]
        for name, values in columns.items():
            values = values[~np.isnan(values)]
            out[f"{name}_mean_s"] = float(values.mean()) if len(values) else math.nan
            out[f"{name}_std_s"] = float(values.std()) if len(values) else math.nan  # numpy's, as vllm bench
            for p in PERCENTILES:
                out[f"{name}_p{p}_s"] = float(np.percentile(values, p)) if len(values) else math.nan
        return out


#: ``vllm bench serve``'s metric names and the summary column each is read from.
BENCH_METRICS = (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2el", "e2e"))
#: ``vllm bench serve``'s statistics (``mean_ttft_ms``, ``median_ttft_ms``, ...) and the summary's.
BENCH_STATS = (("mean", "mean"), ("median", "p50"), ("std", "std"), ("p90", "p90"), ("p95", "p95"), ("p99", "p99"))
#: Every field :func:`bench_fields` gives, in order: a table of them has these columns.
BENCH_FIELDS = (("completed", "duration", "request_throughput", "request_goodput", "output_throughput",
                 "total_token_throughput", "max_concurrency", "request_rate")
                + tuple(f"{stat}_{metric}_ms" for metric, _ in BENCH_METRICS for stat, _ in BENCH_STATS))


def _finite(value: Any, scale: float = 1.0) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v * scale if math.isfinite(v) else None


def bench_fields(summary: Mapping[str, Any], load: Any = None) -> dict[str, float | None]:
    """A run's :meth:`RunResult.summary` under the names ``vllm bench serve --save-result``
    writes (:data:`BENCH_FIELDS`): ``request_throughput`` (req/s), ``output_throughput`` and
    ``total_token_throughput`` (tok/s), ``duration`` (s), and ``mean/median/std/p90/p95/p99``
    of ``ttft``, ``tpot``, ``itl`` and ``e2el`` in **milliseconds**. ``load`` (a
    :class:`tuner.serving.load.Load` or its label, ``"264 users"``) gives ``max_concurrency`` (closed
    loop) or ``request_rate`` (Poisson, req/s) as numbers; a trace replay has neither.

    A statistic the summary does not hold is ``None``, never guessed: ``std_*`` of a run
    recorded before tuner kept it, ``*_itl_ms`` of a run without per-token times, and
    ``request_goodput`` of a study without SLOs besides throughput."""

    if isinstance(load, str):
        try:
            load = parse_load(load)
        except InputError:
            load = None
    out: dict[str, float | None] = {
        "completed": _finite(summary.get("completed")), "duration": _finite(summary.get("duration_s")),
        "request_throughput": _finite(summary.get("requests_per_s")),
        "request_goodput": _finite(summary.get("goodput_requests_per_s")),
        "output_throughput": _finite(summary.get("output_tokens_per_s")),
        "total_token_throughput": _finite(summary.get("tokens_per_s")),
        "max_concurrency": float(load.users) if isinstance(load, Concurrency) else None,
        "request_rate": float(load.rate) if isinstance(load, Poisson) else None,
    }
    for metric, column in BENCH_METRICS:
        for stat, suffix in BENCH_STATS:
            out[f"{stat}_{metric}_ms"] = _finite(summary.get(f"{column}_{suffix}_s"), 1e3)
    return out


def describe_errors(counts: dict[str, int] | None, *, limit: int = 4) -> str:
    """``http_429 x400, timeout x3`` (the ``limit`` most frequent kinds, then ``+N more``);
    ``""`` for none."""
    items = sorted(((str(k), int(v)) for k, v in (counts or {}).items() if v), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{k} x{v}" for k, v in items[:limit])
    if len(items) > limit:
        text += f", +{len(items) - limit} more kinds"
    return text

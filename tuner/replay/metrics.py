"""Read a vLLM server's Prometheus ``/metrics`` while a run goes on.

Metric names are vLLM V1's (``vllm/v1/metrics/loggers.py``; see
shared/reference/vllm-facts.md section 3): gauges ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (0-1), counters
``vllm:num_preemptions_total``, ``vllm:prefix_cache_queries_total``,
``vllm:prefix_cache_hits_total`` (tokens), and the info metric
``vllm:cache_config_info`` whose ``num_gpu_blocks`` label gives the KV cache size.
Older servers (0.6 line) export ``vllm:gpu_cache_usage_perc`` and
``vllm:num_preemptions_total``; both spellings are read.
"""
from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

GAUGES = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
COUNTERS = {
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
}


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``{metric name: [(labels, value), ...]}`` from Prometheus text format."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _first(metrics: dict, names: tuple[str, ...], reduce=sum) -> float | None:
    for name in names:
        if name in metrics:
            return float(reduce(v for _, v in metrics[name]))
    return None


def snapshot(metrics: dict) -> dict[str, float]:
    """One reading, summed over engines (DP ranks); KV usage is the max over engines."""
    snap: dict[str, float] = {}
    for key, names in GAUGES.items():
        value = _first(metrics, names, max if key == "kv_usage" else sum)
        if value is not None:
            snap[key] = value
    for key, names in COUNTERS.items():
        value = _first(metrics, names)
        if value is not None:
            snap[key] = value
    blocks = [lab.get("num_gpu_blocks") for lab, _ in metrics.get("vllm:cache_config_info", [])]
    blocks = [int(b) for b in blocks if b and b.isdigit()]
    if blocks:
        snap["num_gpu_blocks"] = float(min(blocks))
    return snap


@dataclass
class MetricsPoller:
    """Polls ``/metrics`` of each endpoint every ``interval_s`` until stopped
    (``headers[i]``, when given, go with endpoint ``i``'s requests: its credentials)."""

    endpoints: list[str]
    interval_s: float = 0.5
    samples: list[list[dict[str, float]]] = field(default_factory=list)
    failures: int = 0
    headers: list[dict[str, str]] | None = field(default=None, repr=False)

    async def read(self, session: aiohttp.ClientSession, base: str,
                   headers: dict[str, str] | None = None) -> dict[str, float] | None:
        try:
            async with session.get(f"{base}/metrics", headers=headers or None,
                                   timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status != 200:
                    return None
                return snapshot(parse_prometheus(await resp.text()))
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        hdrs = self.headers or [None] * len(self.endpoints)
        readings = await asyncio.gather(*(self.read(session, b, h) for b, h in zip(self.endpoints, hdrs)))
        if any(r is None for r in readings):
            self.failures += 1
        self.samples.append([r or {} for r in readings])

    async def run(self, session: aiohttp.ClientSession, done: asyncio.Event) -> None:
        while not done.is_set():
            await self.poll_once(session)
            try:
                await asyncio.wait_for(done.wait(), self.interval_s)
            except asyncio.TimeoutError:
                pass
        await self.poll_once(session)  # the final counters

    def summary(self) -> dict[str, Any]:
        """Aggregates for ``RunResult.server``: peaks, means and counter deltas."""
        out: dict[str, Any] = {"metrics_samples": len(self.samples), "metrics_failures": self.failures}
        if not self.samples:
            return out
        n_ep = len(self.endpoints)

        def series(key: str, reduce) -> list[float]:
            rows = []
            for sample in self.samples:
                vals = [ep[key] for ep in sample if key in ep]
                if vals:
                    rows.append(reduce(vals))
            return rows

        for key, name in (("running", "num_requests_running"), ("waiting", "num_requests_waiting")):
            s = series(key, sum)
            if s:
                out[f"{name}_max"] = max(s)
                out[f"{name}_mean"] = sum(s) / len(s)
        s = series("kv_usage", max)
        if s:
            out["kv_cache_usage_max"] = max(s)
            out["kv_cache_usage_mean"] = sum(s) / len(s)
        # Counters: last minus first reading, per endpoint, summed.
        for key, name in (("preemptions", "num_preemptions"), ("prefix_queries", "prefix_cache_queries"),
                          ("prefix_hits", "prefix_cache_hits")):
            total, seen = 0.0, False
            for e in range(n_ep):
                vals = [sample[e][key] for sample in self.samples if key in sample[e]]
                if vals:
                    total += vals[-1] - vals[0]
                    seen = True
            if seen:
                out[name] = total
        q, h = out.get("prefix_cache_queries"), out.get("prefix_cache_hits")
        if q is not None and h is not None:
            out["prefix_cache_hit_rate"] = h / q if q > 0 else math.nan
        blocks = [sample[e].get("num_gpu_blocks") for sample in self.samples[:1] for e in range(n_ep)]
        blocks = [b for b in blocks if b is not None]
        if blocks:
            out["num_gpu_blocks"] = int(min(blocks))
        return out

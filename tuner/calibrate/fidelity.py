"""How truthful the simulator is: its raw predictions against real vLLM, grouped by what
users serve, and the crossovers a tuner must get on the right side.

Input is a :func:`tuner.calibrate.fit` table (one row per measured load point, with
``set`` = ``fit`` or ``check``); the numbers that matter are those of the ``check`` rows,
which the fit never saw.

* :func:`by_shape` groups rows by model shape, workload shape and arrival kind
  (``7B prefill closed``, ``7B mix open``, ``MoE decode closed``...) and gives each group's
  MAPE of tokens/s (prompt + output), output tokens/s, P95 and mean TTFT and mean TPOT.
* :func:`crossovers` compares pairs of load points that differ in one knob (eager vs CUDA
  graphs, 2048 vs 8192 batched tokens, fp8 vs bf16 KV, shared vs unique prefixes...): the
  measured ratio, the predicted one, and whether the simulator picks the same side. A
  measured difference inside the run-to-run noise (twice the sd of a ratio of two runs, for
  the kind of load: :func:`noise_bucket`) is a tie: no side is right or wrong there.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Shape labels of the model presets the calibrations measured.
MODEL_LABELS = {"qwen2.5-7b": "7B", "qwen2.5-32b": "32B", "qwen3-30b-a3b": "MoE", "llama-3.1-8b": "Llama8B",
                "mistral-nemo-12b": "Nemo12B"}
#: Metrics compared per group: (row key, column label).
COLUMNS = (("tokens_per_s", "tok/s"), ("output_tokens_per_s", "out tok/s"), ("ttft_p95_s", "P95 TTFT"),
           ("ttft_mean_s", "mean TTFT"), ("tpot_mean_s", "TPOT"))
#: Tail latencies users state as service levels (``--slo p99:tpot<=30ms``), compared beside
#: :data:`COLUMNS` by :func:`with_tails`: (summary key, column label).
TAILS = (("tpot_p99_s", "P99 TPOT"), ("itl_p95_s", "P95 ITL"))


def shape(row: dict[str, Any]) -> str:
    """``7B prefill closed``: model shape, workload shape, closed or open loop."""
    model = MODEL_LABELS.get(str(row.get("model")), str(row.get("model")))
    load = "closed" if row.get("load", "concurrency") == "concurrency" else "open"
    return f"{model} {row.get('workload', 'uniform')} {load}"


def mape(rows: Sequence[dict[str, Any]], key: str) -> float:
    pairs = [(r[f"{key}_predicted"], r[f"{key}_measured"]) for r in rows
             if f"{key}_measured" in r and r[f"{key}_measured"]]
    if not pairs:
        return math.nan
    p, m = np.array(pairs, dtype=float).T
    return float(np.mean(np.abs(p - m) / np.abs(m)) * 100)


def worst(rows: Sequence[dict[str, Any]], key: str) -> float:
    errs = [abs(r[f"{key}_predicted"] / r[f"{key}_measured"] - 1) * 100 for r in rows
            if f"{key}_measured" in r and r[f"{key}_measured"]]
    return max(errs, default=math.nan)


def with_tails(table: Sequence[dict[str, Any]], measured: dict[str, dict[str, Any]],
               predicted: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """The rows of a comparison table (``name`` per row) with each :data:`TAILS` metric as
    ``<key>_measured`` (from ``measured[name]``, the real run's summary) and
    ``<key>_predicted`` (from ``predicted[name]``, the simulator's), where both have it."""
    out = []
    for r in table:
        row = dict(r)
        m, p = measured.get(r["name"]) or {}, predicted.get(r["name"]) or {}
        for key, _ in TAILS:
            if _finite(m.get(key)) and _finite(p.get(key)):
                row[f"{key}_measured"], row[f"{key}_predicted"] = float(m[key]), float(p[key])
        out.append(row)
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def by_shape(table: Sequence[dict[str, Any]], which: str = "check") -> list[dict[str, Any]]:
    """One row per shape group of the ``which`` set: points and each metric's MAPE."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in table:
        if r.get("set") == which:
            groups.setdefault(shape(r), []).append(r)
    return [{"shape": name, "points": len(rows), **{key: mape(rows, key) for key, _ in COLUMNS + TAILS}}
            for name, rows in sorted(groups.items())]


@dataclass(frozen=True)
class Crossover:
    """Two load points that differ in one knob: A against B."""

    question: str
    a: str                       # point names (tuner.calibrate.point_name)
    b: str
    metric: str = "output_tokens_per_s"
    higher_is_better: bool = True


@dataclass(frozen=True)
class CrossoverResult:
    crossover: Crossover
    measured: float              # A / B measured
    predicted: float             # A / B predicted
    band: float                  # measured ratios within 1 +- band are ties
    verdict: str                 # "right side", "wrong side", "tie (within noise)"

    @property
    def winner_measured(self) -> str:
        return self._winner(self.measured)

    @property
    def winner_predicted(self) -> str:
        return self._winner(self.predicted, tie=0.0)

    def _winner(self, ratio: float, tie: float | None = None) -> str:
        t = self.band if tie is None else tie
        if abs(ratio - 1) <= t:
            return "tie"
        better_a = ratio > 1 if self.crossover.higher_is_better else ratio < 1
        return "A" if better_a else "B"


#: A predicted ratio this close to 1 picks no side.
NO_PREFERENCE = 0.01


def noise_bucket(point: Any) -> str:
    """How noisy a load point is, by what the replicate starts showed: ``eager`` (launch-bound,
    25-30 % apart between starts), ``high`` (more than 64 closed-loop users: the front end's
    backlog, 9-35 % apart), else ``low`` (at most 64 users or open loop below saturation:
    within 4 %)."""
    if point.config.enforce_eager:
        return "eager"
    return "high" if point.load is None and point.users > 64 or (point.load or {}).get("users", 0) > 64 else "low"


def noise_by_bucket(pairs: Sequence[tuple[Any, Any]], metric: str = "output_tokens_per_s",
                    floor: float = 0.01) -> dict[str, float]:
    """sd of one run's log ``metric`` per :func:`noise_bucket`, from replicate pairs."""
    diffs: dict[str, list[float]] = {}
    for a, b in pairs:
        if metric in a.measured and metric in b.measured:
            diffs.setdefault(noise_bucket(a), []).append(math.log(b.measured[metric] / a.measured[metric]))
    return {k: max(floor, float(np.sqrt(np.mean(np.square(v)) / 2))) for k, v in diffs.items()}


def crossovers(table: Sequence[dict[str, Any]], pairs: Sequence[Crossover], noise: dict[str, float],
               buckets: dict[str, str] | None = None) -> list[CrossoverResult]:
    """Measured and predicted ratio of each pair present in ``table`` (by point name). The
    tie band is twice the sd of a ratio of two runs (2 sqrt(2) sd of one): ``noise[bucket]``
    for the noisier of the two points when ``buckets`` (point name -> bucket) is given,
    else ``noise[metric]``. A pair the simulator predicts within 1 % of even picks no side."""
    by = {r["name"]: r for r in table}
    out = []
    for c in pairs:
        if c.a not in by or c.b not in by:
            continue
        ra, rb = by[c.a], by[c.b]
        measured = ra[f"{c.metric}_measured"] / rb[f"{c.metric}_measured"]
        predicted = ra[f"{c.metric}_predicted"] / rb[f"{c.metric}_predicted"]
        if buckets is not None:
            sd = max(float(noise.get(buckets.get(name, "high"), 0.08)) for name in (c.a, c.b))
        else:
            sd = float(noise.get(c.metric, 0.08))
        band = math.expm1(2 * math.sqrt(2) * sd)
        if abs(measured - 1) <= band:
            verdict = "tie (within noise)"
        elif abs(predicted - 1) < NO_PREFERENCE:
            verdict = "simulator sees no difference"
        else:
            verdict = "right side" if (measured > 1) == (predicted > 1) else "wrong side"
        out.append(CrossoverResult(c, measured, predicted, band, verdict))
    return out


def longest_silence(send_s: Any, ttft_s: Any, e2e_s: Any) -> tuple[float, float]:
    """The longest stretch of a run in which no request got its first token or finished
    (what a client sees of an engine that stalls, e.g. compiling a kernel mid-run), and when
    it began, from per-request send, TTFT and E2E times (NaN for failed requests)."""
    send, ttft, e2e = (np.asarray(x, dtype=float) for x in (send_s, ttft_s, e2e_s))
    ok = ~np.isnan(ttft) & ~np.isnan(e2e)
    events = np.sort(np.concatenate([send[ok] + ttft[ok], send[ok] + e2e[ok]]))
    if len(events) < 2:
        return 0.0, math.nan
    gaps = np.diff(events)
    k = int(np.argmax(gaps))
    return float(gaps[k]), float(events[k])


def _n(trial: str, label: str) -> str:
    return f"{trial}: {label}"


#: The crossovers the H200 campaigns measured (tuner/data/calibration/h200-vllm-0.26.0).
H200_CROSSOVERS = (
    Crossover("CUDA graphs vs eager, 1 user (decode floor)", _n("base", "uniform x10 @ 1 users"),
              _n("eager", "uniform x5 @ 1 users")),
    Crossover("CUDA graphs vs eager, 32 users", _n("base", "uniform x128 @ 32 users"),
              _n("eager", "uniform x128 @ 32 users")),
    Crossover("CUDA graphs vs eager, 512 users", _n("base", "uniform x1024 @ 512 users"),
              _n("eager", "uniform x1024 @ 512 users")),
    Crossover("2048 vs 8192 batched tokens, mix @ 64 users", _n("q7-mbt2048", "mix x256 @ 64 users"),
              _n("q7-base", "mix x256 @ 64 users")),
    Crossover("2048 vs 8192 batched tokens, mix @ 256 users", _n("q7-mbt2048", "mix x512 @ 256 users"),
              _n("q7-base", "mix x512 @ 256 users")),
    Crossover("2048 vs 8192 batched tokens, mix @ 256 users: P95 TTFT", _n("q7-mbt2048", "mix x512 @ 256 users"),
              _n("q7-base", "mix x512 @ 256 users"), metric="ttft_p95_s", higher_is_better=False),
    Crossover("2048 vs 8192 batched tokens, prefill-heavy @ 16 users", _n("q7-mbt2048", "prefill x96 @ 16 users"),
              _n("q7-base", "prefill x96 @ 16 users")),
    Crossover("2048 vs 8192 batched tokens, prefill-heavy @ 64 users", _n("q7-mbt2048", "prefill x256 @ 64 users"),
              _n("q7-base", "prefill x256 @ 64 users")),
    Crossover("prefix caching on shared prefixes: shared vs made unique",
              _n("q7-base", "mooncake 0-64 shared prefixes @ 8 users"),
              _n("q7-base", "mooncake 0-64 shared prefixes made unique @ 8 users")),
    Crossover("fp8 vs bf16 KV cache, mix @ 256 users", _n("q7-fp8", "mix x512 @ 256 users"),
              _n("q7-base", "mix x512 @ 256 users")),
    Crossover("fp8 vs bf16 KV cache, 16k-30k-token prompts @ 2 users", _n("q7-fp8", "long x6 @ 2 users"),
              _n("q7-base", "long x6 @ 2 users")),
    Crossover("max-num-seqs 16 vs default, 32 users", _n("seqs16", "uniform x128 @ 32 users"),
              _n("base", "uniform x128 @ 32 users")),
)


__all__ = ["COLUMNS", "TAILS", "Crossover", "CrossoverResult", "H200_CROSSOVERS", "NO_PREFERENCE", "by_shape", "crossovers", "with_tails",  # noqa: E501
           "longest_silence", "mape", "noise_bucket", "noise_by_bucket", "shape", "worst"]

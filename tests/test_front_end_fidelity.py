"""The API server in front of vLLM's engine, judged on real measurements no fit saw: campaign 6
of benchmarks/h200 (an H100, vLLM 0.26.0, the 7B shape), two fresh starts with vLLM's one API
server and one with ``--api-server-count 4``, each measuring two decode-heavy probes at 256
users on the same host. One server capped output at ~14k tokens/s (a token every ~72 us); four
gave tokens/s x1.18-1.21 and P95 TTFT x0.37-0.41. ``api_server_count`` has no constant of its own
(N processes as one front-end queue N times as fast), so this checks the mechanism, not a fit."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuner.calibrate import compare_loads, load_points, read_measurements
from tuner.serving.config import Deployment

ROWS = Path(__file__).resolve().parents[1] / "benchmarks" / "h200" / "campaign6" / "measurements.jsonl"
METRICS = ("tokens_per_s", "ttft_p95_s")


def _decode_at_256() -> dict[tuple[int, int], list[tuple[dict, dict]]]:
    """(API servers, requests) -> [(measured, predicted)] of the 256-user decode probes, each the
    probe replayed on the simulator (:func:`tuner.calibrate.compare_loads`) on the H100 it ran on."""
    points = [p for p in load_points(read_measurements(ROWS)) if (p.workload or {}).get("kind") == "decode"]
    out: dict[tuple[int, int], list[tuple[dict, dict]]] = {}
    for p, r in zip(points, compare_loads(points, Deployment(model="qwen2.5-7b", gpu="H100-SXM", vllm_version="0.26.0"))):  # noqa: E501
        pair = ({k: r[f"{k}_measured"] for k in METRICS}, {k: r[f"{k}_predicted"] for k in METRICS})
        out.setdefault((p.config.api_server_count or 1, p.requests), []).append(pair)
    return out


@pytest.fixture(scope="module")
def decode():
    return _decode_at_256()


def test_the_campaign_measured_what_this_checks(decode):
    assert sorted(decode) == [(1, 320), (1, 384), (4, 320), (4, 384)]
    assert all(len(decode[(1, n)]) == 2 and len(decode[(4, n)]) == 1 for n in (320, 384))


@pytest.mark.parametrize("requests", [320, 384])
def test_four_api_servers_are_predicted_where_they_were_measured(decode, requests):
    (measured, predicted), = decode[(4, requests)]
    assert predicted["tokens_per_s"] == pytest.approx(measured["tokens_per_s"], rel=0.05)
    assert predicted["ttft_p95_s"] == pytest.approx(measured["ttft_p95_s"], rel=0.15)


@pytest.mark.parametrize("requests", [320, 384])
def test_the_gain_of_four_api_servers_has_the_measured_direction_and_size(decode, requests):
    def ratio(key: str, which: int) -> float:
        four = np.mean([pair[which][key] for pair in decode[(4, requests)]])
        return float(four / np.mean([pair[which][key] for pair in decode[(1, requests)]]))

    # measured: tokens/s x1.18-1.21, P95 TTFT x0.37-0.41 (benchmarks/h200/campaign6/README.md); predicted
    # x1.11-1.12 and x0.40-0.41 (the one-server starts are predicted 1-11 % high: the gain is partly hidden)
    assert ratio("tokens_per_s", 0) > 1.15 and ratio("ttft_p95_s", 0) < 0.45
    assert ratio("tokens_per_s", 1) > 1.08 and ratio("ttft_p95_s", 1) < 0.5
    assert ratio("ttft_p95_s", 1) == pytest.approx(ratio("ttft_p95_s", 0), abs=0.1)

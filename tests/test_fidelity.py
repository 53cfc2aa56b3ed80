"""Fidelity of the simulator with the shipped H200 profile against real vLLM 0.26.0.

Data: tuner/data/calibration/h200-vllm-0.26.0/ (measured 2026-11-30 on one H200 through the
tuner's own vLLM backend and replayer; README there). The profile was fitted on the trials
listed in its ``fit.fit_trials`` (base, eager, seqs64, kvlimited) and is checked here on the
rest (``fit.check_trials``: seqs16, mbt1024, eager128, mml8k with loads; the refusal and bs32
start only), so the load-point numbers below measure prediction, not memory. The KV-size
checks cover every start (the memory constants were fitted on the four fit trials too).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tuner.calibrate import (
    compare_loads,
    compare_startups,
    load_points,
    read_measurements,
    startups,
    summarize,
)
from tuner.config import Deployment
from tuner.sim.calibration import find_profile

DATA = Path(__file__).resolve().parents[1] / "tuner" / "data" / "calibration" / "h200-vllm-0.26.0"
DEP = Deployment(model="qwen2.5-7b", gpu="H200", vllm_version="0.26.0")


@pytest.fixture(scope="module")
def rows():
    return read_measurements(DATA / "measurements.jsonl")


@pytest.fixture(scope="module")
def profile():
    return yaml.safe_load((DATA / "profile.yaml").read_text())


@pytest.fixture(scope="module")
def table(rows):
    # the deployment names no profile: the shipped one must be found by GPU and version
    return compare_loads(load_points(rows), DEP)


def test_shipped_profile_applies_to_h200_with_vllm_0_26():
    assert find_profile("H200", "0.26.0") == str(DATA / "profile.yaml")
    assert find_profile("h200-sxm", "0.26.0") == str(DATA / "profile.yaml")
    assert find_profile("H200", "0.25.0") is None
    assert find_profile("H100-SXM", "0.26.0") is None


def test_design_was_measured(rows, profile):
    starts = startups(rows)
    points = load_points(rows)
    assert len(starts) >= 8
    assert sum(1 for s in starts if not s.ok) == 1
    per_trial = {}
    for p in points:
        per_trial.setdefault(p.trial, set()).add(p.users)
    assert len(per_trial) >= 8 and all(len(u) == 3 and 1 in u for u in per_trial.values())
    held = set(profile["fit"]["check_trials"])
    assert not held & set(profile["fit"]["fit_trials"])
    assert len(held & set(per_trial)) >= 4


def test_kv_cache_size_within_3_percent_for_every_start(rows):
    kv = compare_startups(startups(rows), DEP)
    ok = [r for r in kv if r["measured_ok"]]
    assert ok and all(r["predicted_ok"] for r in ok)
    worst = max(abs(r["error_pct"]) for r in ok)
    assert worst <= 3.0, kv
    # achieved (for the report): worst 1.13 % (eager128, whose peak activation vLLM logs as
    # 0.10 GiB against ~1.1 GiB for every other start)
    assert worst < 1.5


def test_refusal_predicted_with_vllms_estimated_max_model_len(rows, profile):
    kv = compare_startups(startups(rows), DEP)
    refused = [r for r in kv if not r["measured_ok"]]
    assert len(refused) == 1
    r = refused[0]
    assert r["trial"] in profile["fit"]["check_trials"]          # held back from the fit
    assert r["kind"] == r["predicted_kind"] == "max_model_len"
    assert r["measured"] == 8320                                  # vLLM's own message
    assert abs(r["error_pct"]) <= 3.0, r


def held_out(table, profile):
    check = set(profile["fit"]["check_trials"])
    return [r for r in table if r["trial"] in check]


def test_held_out_load_points_meet_the_targets(table, profile):
    rows = held_out(table, profile)
    assert len(rows) == 12
    s = summarize(rows)
    assert s["output_tokens_per_s_mape"] <= 10.0, s   # achieved 5.2
    assert s["ttft_p95_s_mape"] <= 20.0, s             # achieved 9.3
    assert s["tpot_mean_s_mape"] <= 10.0, s            # achieved 6.8
    # the profile's own report says what this test sees
    reported = profile["fit"]["errors"]["check"]
    for k in ("output_tokens_per_s_mape", "ttft_p95_s_mape", "tpot_mean_s_mape"):
        assert s[k] == pytest.approx(reported[k], abs=0.5)


def test_throughput_rank_correlation_across_configurations(table, profile):
    rows = held_out(table, profile)
    s = summarize(rows)
    assert s["throughput_spearman_all"] >= 0.9, s           # 12 held-out points: 0.99
    assert s["throughput_spearman_saturation"] >= 0.9, s    # 4 held-out configs at saturation: 1.0
    # All 8 configurations at saturation (fit ones included): 0.83, BELOW the 0.9 target.
    # Four of them (base, kvlimited, mbt1024, mml8k) lie within 9 % of each other, and base
    # alone measured 7176 and 7810 tok/s in two runs (replicate.jsonl): their order is noise.
    everything = summarize(table)
    assert everything["throughput_spearman_saturation"] >= 0.8, everything


def test_eager_vs_cuda_graphs_decode_gap(rows, table):
    one = {r["trial"]: r for r in table if r["users"] == 1}
    pred = one["eager"]["tpot_mean_s_predicted"] / one["base"]["tpot_mean_s_predicted"]
    # measured ratios of eager to graphs at one user: this run and the replicate run
    rep = {(r["trial"], r["users"]): r["summary"]["tpot_mean_s"]
           for r in read_measurements(DATA / "replicate.jsonl") if r.get("kind") == "load"}
    measured = [one["eager"]["tpot_mean_s_measured"] / one["base"]["tpot_mean_s_measured"],
                rep[("eager", 1)] / rep[("base", 1)]]
    assert min(measured) <= pred <= max(measured), (pred, measured)   # 3.30 in [2.88, 3.43]
    # held back: eager128's decode floor. vLLM measured 11.1 ms there against 13.7 and 16.2 ms
    # for the same eager decode in the other runs; the prediction (15.5 ms) sits in that spread
    eager_tpots = [one[t]["tpot_mean_s_measured"] for t in ("eager", "eager128")] + [rep[("eager", 1)]]
    assert min(eager_tpots) <= one["eager128"]["tpot_mean_s_predicted"] <= max(eager_tpots)
    # graphs keep the decode floor at every batch cap (held back: seqs16, mbt1024, mml8k)
    graph = [r for r in table if r["users"] == 1 and r["trial"] in ("seqs16", "mbt1024", "mml8k")]
    err = [abs(r["tpot_mean_s_predicted"] / r["tpot_mean_s_measured"] - 1) for r in graph]
    assert max(err) < 0.03, err


def test_replicate_run_is_within_the_noise_the_targets_allow():
    """The replicate (base, eager, seqs16 started again) bounds what any model can reach."""
    first = {(r["trial"], r["users"]): r["summary"] for r in read_measurements(DATA / "measurements.jsonl")
             if r.get("kind") == "load"}
    again = [r for r in read_measurements(DATA / "replicate.jsonl") if r.get("kind") == "load"]
    assert len(again) == 9
    diffs = [abs(r["summary"]["output_tokens_per_s"] / first[(r["trial"], r["users"])]["output_tokens_per_s"] - 1)
             for r in again]
    assert float(np.mean(diffs)) < 0.10


def test_shipped_constants_carry_intervals_and_say_what_the_data_determined(profile):
    fitted = ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "per_seq_overhead_s", "request_latency_s")
    for name in fitted:
        entry = profile[name]
        lo, hi = entry["ci95"]
        assert lo <= entry["value"] <= hi and entry["determined"] in ("data", "prior"), name
    # what one model shape can and cannot tell: prefill FLOPs, eager launches and the API
    # latency are measured; HBM efficiency and the step overhead both lengthen every decode
    # step by a fixed amount, so only their combination is (reported as a correlation)
    assert profile["flops_efficiency"]["determined"] == "data"
    assert profile["request_latency_s"]["determined"] == "data"
    assert profile["launch_per_layer_s"]["determined"]["eager"] == "data"
    assert profile["hbm_efficiency"]["determined"] == "prior"
    assert any("hbm_efficiency ~ step_overhead_s" in c for c in profile["fit"]["correlated"])
    assert profile["fit"]["start_spread_sd"] < 0.5      # every start found the same optimum


@pytest.mark.slow
def test_a_refit_on_the_committed_data_agrees_with_the_shipped_profile_within_its_intervals(rows, profile):
    """Re-fit on the committed measurements (converged, from the class table): each constant
    lands inside the shipped 95 % interval, and the held-back errors are the published ones.
    The shipped constants are the fit's, not hand-tuned, and do not hang on the optimiser's path."""
    from tuner.calibrate import fit, measurement_noise

    noise = measurement_noise(rows, read_measurements(DATA / "replicate.jsonl"))
    assert noise == pytest.approx(profile["fit"]["noise"], abs=1e-3)
    res = fit(rows, DEP, fit_trials=profile["fit"]["fit_trials"], noise=noise)
    est = res.info["step_time"]["estimates"]
    assert res.info["step_time"]["status"] > 0          # converged (scipy: a tolerance was met)
    for name in ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "per_seq_overhead_s", "request_latency_s"):
        lo, hi = profile[name]["ci95"]
        assert lo <= est[name]["value"] <= hi, (name, est[name]["value"], (lo, hi))
        assert est[name]["determined"] == profile[name]["determined"], name
    lo, hi = profile["launch_per_layer_s"]["ci95"]["eager"]
    assert lo <= res.calibration.launch_per_layer_s["eager"] <= hi
    for k in ("output_tokens_per_s_mape", "ttft_p95_s_mape", "tpot_mean_s_mape"):
        assert res.errors["check"][k] == pytest.approx(profile["fit"]["errors"]["check"][k], abs=0.5), k
    for k, v in profile["memory"].items():
        assert res.memory[k] == pytest.approx(v, rel=0.01, abs=1e-6), k

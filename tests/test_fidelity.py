"""Fidelity of the simulator with the shipped H200 profile against real vLLM 0.26.0.

Data: tuner/data/calibration/h200-vllm-0.26.0/ (two campaigns on one H200 through the tuner's
own vLLM backend and replayer; README there). The profile was fitted on the load points of
``fit_points.txt`` (closed-loop loads of the first start of each model shape) and is checked
here on the rest: open-loop arrivals, the Azure trace's timestamps, Mooncake prefixes, other
knobs (max-num-batched-tokens 2048, fp8 KV), a fresh restart and the loads each shape kept
back. The KV-size checks cover every start. ``python benchmarks/fidelity.py`` prints it all.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tuner.calibrate import (
    campaign_rows,
    compare_loads,
    compare_startups,
    load_points,
    measurement_noise,
    point_name,
    read_measurements,
    read_names,
    replicate_pairs,
    startups,
    summarize,
)
from tuner.calibrate.fidelity import H200_CROSSOVERS, by_shape, crossovers, mape, noise_bucket, noise_by_bucket, worst
from tuner.serving.config import Deployment
from tuner.sim.calibration import find_profile

DATA = Path(__file__).resolve().parents[1] / "tuner" / "data" / "calibration" / "h200-vllm-0.26.0"
DEP = Deployment(model="qwen2.5-7b", gpu="H200", vllm_version="0.26.0")


@pytest.fixture(scope="module")
def rows():
    return campaign_rows(DATA)


@pytest.fixture(scope="module")
def profile():
    return yaml.safe_load((DATA / "profile.yaml").read_text())


@pytest.fixture(scope="module")
def table(rows, profile):
    """Every load point (the excluded one left out), predicted with the shipped profile (the
    deployment names none: it must be found by GPU and version), marked fit or check."""
    chosen = set(profile["fit"]["fit_points"])
    excluded = set(profile["fit"].get("excluded") or [])
    points = [p for p in load_points(rows) if point_name(p) not in excluded]
    out = compare_loads(points, DEP)
    for p, r in zip(points, out):
        r["set"] = "fit" if p.trial in chosen or point_name(p) in chosen else "check"
    return out


def held_out(table):
    return [r for r in table if r["set"] == "check"]


def test_shipped_profile_applies_to_h200_with_vllm_0_26():
    assert find_profile("H200", "0.26.0") == str(DATA / "profile.yaml")
    assert find_profile("h200-sxm", "0.26.0") == str(DATA / "profile.yaml")
    assert find_profile("H200", "0.25.0") is None
    assert find_profile("H100-SXM", "0.26.0") is None


def test_the_fit_selection_is_the_shipped_files(profile):
    assert profile["fit"]["fit_points"] == read_names(DATA / "fit_points.txt")
    assert profile["fit"]["excluded"] == read_names(DATA / "excluded_points.txt")


def test_campaigns_span_the_shapes_users_serve(rows, table):
    starts = startups(rows)
    # two refusals: campaign 1's gmu 0.115 (7B, eager) and campaign 4's l8-gmu014 (Llama-3.1-8B shape at
    # gmu 0.14: "4.0 GiB KV cache is needed, which is larger than the available KV cache memory (3.24 GiB)")
    assert len(starts) >= 16 and sorted(s.trial for s in starts if not s.ok) == ["l8-gmu014", "refuse"]
    models = {s.model or DEP.model for s in starts}
    assert models == {"qwen2.5-7b", "qwen2.5-32b", "qwen3-30b-a3b", "llama-3.1-8b", "mistral-nemo-12b"}
    kinds = {(r["workload"], r["load"]) for r in table}
    for shape in ("prefill", "decode", "mix", "long", "trace"):
        assert any(w == shape for w, _ in kinds), shape
    assert ("mix", "poisson") in kinds and ("trace", "trace") in kinds     # open loop, the Azure trace's times
    check = held_out(table)
    assert len(check) >= 30 and {r["load"] for r in check} >= {"concurrency", "poisson", "trace"}


def test_kv_cache_size_within_1_percent_for_every_start(rows):
    kv = compare_startups(startups(rows), DEP)
    ok = [r for r in kv if r["measured_ok"]]
    assert ok and all(r["predicted_ok"] for r in ok)
    worst_kv = max(abs(r["error_pct"]) for r in ok)
    assert worst_kv <= 1.0, kv   # achieved 0.54 % (kvlimited, a restart that hit the compile cache: 1.06 GiB
    # of peak activation where cold starts log 1.13) and 0.50 % (the MoE shape); 0.04 % for the eager 512-token start
    by_model = {r["model"] for r in ok}
    assert by_model == {"qwen2.5-7b", "qwen2.5-32b", "qwen3-30b-a3b", "llama-3.1-8b", "mistral-nemo-12b"}
    # campaign 3's Nemo start ran every layer with a 4096-token window (the model folder lost the
    # preset's "sliding_window": null), so its log line counts the tokens its concurrency implies
    # (41,509 blocks / cdiv(min(4095 + 16384, 32768), 16) + 1 = 1281 x 32768 = 1,061,800), not the
    # pool: compared on blocks, -0.22 %
    nemo = next(r for r in ok if r["model"] == "mistral-nemo-12b")
    assert nemo["measured"] == 1_061_800 and nemo["measured_blocks"] == 41_509
    assert 41_509 // (-(-(4095 + 16384) // 16) + 1) == 32 and int(41_509 / 1281 * 32768) == 1_061_800


def test_compiled_peak_activation_follows_vocab_and_batched_tokens_on_every_dense_shape(rows):
    """vLLM 0.26.0 logs each start's peak activation ("Actual usage is ... GiB for peak
    activation"); on a cold torch.compile it is the compile's peak inside the profile run.
    The planner's vocab x hidden + batched-token x hidden figure matches every cold compiled
    dense start within the log's rounding, the Llama and Nemo shapes never fitted; the one
    restart that hit the compile cache (q7-base-again, "torch.compile took 3.28 s") logged
    0.07 GiB less, and the old hidden-size-only slope missed the Llama by 0.16 GiB."""
    from tuner.calibrate.comparison import _dep_model
    from tuner.sim.memory import plan_memory

    logged = {}
    for s in startups(rows):
        if s.ok and s.peak_activation_gib is not None and not s.config.enforce_eager:
            plan = plan_memory(_dep_model(DEP, s.model), s.config)
            logged[s.trial] = (s.model, s.peak_activation_gib, plan.activation_bytes / 2**30)
    dense = {t: v for t, v in logged.items() if v[0] != "qwen3-30b-a3b" and t != "q7-base-again"}
    assert {v[0] for v in dense.values()} == {"qwen2.5-7b", "qwen2.5-32b", "llama-3.1-8b", "mistral-nemo-12b"}
    for trial, (model, measured, predicted) in dense.items():
        assert predicted == pytest.approx(measured, abs=0.015), (trial, model, measured, predicted)
    model, warm, predicted = logged["q7-base-again"]
    assert warm == 1.06 and predicted - warm > 0.05


def refusals(rows):
    return {r["trial"]: r for r in compare_startups(startups(rows), DEP) if not r["measured_ok"]}


def test_refusal_predicted_with_vllms_estimated_max_model_len(rows):
    refused = refusals(rows)
    assert sorted(refused) == ["l8-gmu014", "refuse"]
    for r in refused.values():                                    # both predicted as vLLM's refusal
        assert r["kind"] == r["predicted_kind"] == "max_model_len", r
    # vLLM's own messages: "the estimated maximum model length is 8320" (7B, gmu 0.115, eager) and
    # "... is 26528" (Llama-3.1-8B shape, gmu 0.14, campaign 4)
    assert refused["refuse"]["measured"] == 8320 and refused["l8-gmu014"]["measured"] == 26528
    r = refused["refuse"]
    # achieved +0.58 % (8368): the eager profile run's own peak (1.12 GiB logged) and vLLM's
    # logged non-torch memory (0.22 GiB); at gmu 0.115 the KV cache is 0.44 GiB, so one block
    # (0.9 MB) is 0.2 %. Before: +3.85 %, the compiled runs' peak and a 0.20 GiB guess
    assert abs(r["error_pct"]) <= 1.0, r


def test_refusal_of_the_llama_shape_within_1_percent(rows):
    # vLLM: 3.24 GiB for the KV cache, "estimated maximum model length is 26528"; predicted 26,624
    # (+0.36 %; 24,816, -6.45 %, before). The Llama shape was never fitted: the planner takes its own
    # "Model loading took 15.0 GiB" (l8-base: 0.042 GiB over its weight shapes, where the 7B's is
    # 0.105; with the 7B's figure instead it is -1.57 %) and the compiled profile run's peak as vLLM
    # 0.26.0 charges it on a cold compile, 2.02 bytes per vocab x hidden + 3.58 per batched token x
    # hidden fitted on the 7B, 32B and MoE starts (1.100 GiB at 128,256 x 4096; l8-base logged 1.10),
    # where it scaled the peak with the hidden size alone (1.26 GiB)
    r = refusals(rows)["l8-gmu014"]
    assert r["kind"] == r["predicted_kind"] == "max_model_len"
    assert abs(r["error_pct"]) <= 1.0, r


def test_held_out_tokens_per_s_within_5_percent(table):
    # 57 held-back points with campaigns 3 and 4: 4.6 % once the MoE layers' fixed cost and the
    # experts' own streaming efficiency (campaign 5, an H100) are modelled; 5.6 % before, the MoE
    # mix at one user 53 % off (4.5 % on campaign 2's 33 points)
    assert mape(held_out(table), "tokens_per_s") <= 5.0


def test_held_out_load_points_against_the_targets(table, profile):
    check = held_out(table)
    # targets of the campaign: tokens/s MAPE <= 5 % (worst <= 8 %: both xfail above and below),
    # P95 TTFT MAPE <= 15 %. achieved on 57 held-back points (campaigns 1-4): tokens/s 4.6 %,
    # P95 TTFT 11.6 %, mean TPOT 5.8 %
    assert mape(check, "ttft_p95_s") <= 15.0
    assert mape(check, "tpot_mean_s") <= 8.0
    # the profile's own report says what this test sees on the trials it checked (later
    # campaigns, held back whole, join the held-out set but not the report written before them)
    reported = profile["fit"]["errors"]["check"]
    s = summarize([r for r in check if r["trial"] in profile["fit"]["check_trials"]])
    for k in ("output_tokens_per_s_mape", "ttft_p95_s_mape", "tpot_mean_s_mape"):
        assert s[k] == pytest.approx(reported[k], abs=0.5)
    assert s["throughput_spearman_all"] >= 0.95


def test_the_fit_beats_the_class_table_on_every_held_back_metric(table, rows, profile):
    from tuner.sim.calibration import load_calibration
    from tuner.sim.hardware import get_gpu

    excluded = set(profile["fit"].get("excluded") or [])
    points = [p for p in load_points(rows) if point_name(p) not in excluded]
    base = compare_loads(points, DEP, load_calibration(get_gpu("H200")))
    base_check = [b for b, r in zip(base, table) if r["set"] == "check"]
    for key in ("tokens_per_s", "ttft_p95_s", "tpot_mean_s"):
        assert mape(held_out(table), key) < mape(base_check, key), key


def test_shapes_the_profile_predicts_well_and_where_it_does_not(table):
    shapes = {g["shape"]: g for g in by_shape(table)}
    # dense model shapes, closed loop: within the tokens/s target (achieved 1.4-2.7 %; the
    # prefill-heavy shape was 6.6 % while prefill tokens paid the LM head and the embedding)
    for name in ("32B decode closed", "32B mix closed", "7B prefill closed", "7B trace closed", "7B mix closed"):
        assert shapes[name]["tokens_per_s"] <= 5.0, shapes[name]
    # open loop near the front end's limit: tokens/s follows the offered rate, P95 TTFT does not
    assert shapes["7B mix open"]["tokens_per_s"] <= 2.0
    assert shapes["7B mix open"]["ttft_p95_s"] > 15.0
    # the held-back points over 16 %: the eager decode floor (launch-bound on the host CPU: four
    # starts of eager configurations measured 11.1-22.7 ms per token at one user, campaign 4's
    # eager-r1 the slowest) and the MoE shape at one user (TPOT 4.09 ms warm, 4.12 ms cold,
    # predicted 2.66 ms). (Campaign 2's cold MoE run at 64 users is excluded: the next test.)
    check = held_out(table)
    bad = {r["name"] for r in check if abs(r["tokens_per_s_predicted"] / r["tokens_per_s_measured"] - 1) > 0.16}
    assert bad <= {"eager128: uniform x5 @ 1 users", "eager-r1: uniform x5 @ 1 users",
                   "eager-r1: uniform x128 @ 32 users", "moe-warm: mix x4 @ 1 users"}, bad


@pytest.mark.xfail(strict=True, reason="worst held-back tokens/s error 42 % measured against the 30 % bound "
                   "(target 8 %): 7B eager at one user (eager-r1, the slowest of four starts), see README")
def test_worst_held_back_point_within_30_percent(table):
    assert worst(held_out(table), "tokens_per_s") <= 30.0


def test_the_moe_run_at_64_users_stalled_where_the_simulator_does_not(rows, profile):
    # vLLM 0.26.0 JIT-compiled the fused-MoE Triton kernel during the 1-user replay of this
    # start (its own warning, logged once); the 64-user replay that followed went 1.5 s at a
    # time without a first token or a completion, twice (never over 1.13 s simulated: 0.73 s
    # before the MoE layers' fixed cost was modelled, which lengthens every step of this run;
    # and at most 0.56 s in the same start's 256-user replay): new batch shapes compiling mid-run
    from tuner.calibrate import load_rows, simulate_point
    from tuner.calibrate.fidelity import longest_silence

    by_name = load_rows(rows)
    moe = next(p for p in load_points(rows) if point_name(p) == "moe-base: mix x192 @ 64 users")
    r = by_name[point_name(moe)]
    measured, _ = longest_silence(r["send_s"], r["ttft_s"], r["e2e_s"])
    sim = simulate_point(moe, DEP)
    simulated, _ = longest_silence(sim.send_s, sim.ttft_s, sim.e2e_s)
    assert measured > 1.4 and measured > 1.3 * simulated
    later = by_name["moe-base: mix x512 @ 256 users"]
    assert longest_silence(later["send_s"], later["ttft_s"], later["e2e_s"])[0] < 0.6


def test_no_measured_crossover_is_on_the_wrong_side(table, rows, profile):
    first = load_points(read_measurements(DATA / "measurements.jsonl"))
    again = load_points(read_measurements(DATA / "replicate.jsonl"))
    # excluded points pair with nothing (campaign 2's cold MoE probes against campaign 4's warm ones)
    pairs = replicate_pairs(rows, profile["fit"]["excluded"]) + [(a, b) for a in first for b in again if a.key == b.key]
    sd = noise_by_bucket(pairs)
    assert sd["low"] < 0.03 < sd["high"]          # starts agree within ~4 % at low load, not at 256 users
    points = [p for p in load_points(rows) if point_name(p) not in set(profile["fit"]["excluded"])]
    results = crossovers(table, H200_CROSSOVERS, sd, {point_name(p): noise_bucket(p) for p in points})
    assert len(results) == len(H200_CROSSOVERS)                # every pair was measured
    decided = [c for c in results if c.verdict != "tie (within noise)"]
    assert not [c for c in decided if c.verdict == "wrong side"]
    right = [c for c in decided if c.verdict == "right side"]
    # achieved 6 of 7: 2048-token chunks at 64 users on the mix measured 8 % ahead of the first
    # 8192-token start but 4 % ahead of its fresh restart, whose own two starts differ 4 % there
    # (and max-model-len differed between the starts); the simulator sees them even
    assert len(right) >= len(decided) - 1, [(c.crossover.question, c.measured, c.predicted, c.verdict)
                                            for c in decided]
    questions = {c.crossover.question for c in right}
    for needle in ("eager, 1 user", "prefix", "prefill-heavy @ 64", "max-num-seqs 16"):
        assert any(needle in q for q in questions), needle


def test_the_front_end_explains_hundreds_of_users(table):
    # 7B decode at 256 users: the engine could emit ~21k tok/s, users got 11-15k; the FIFO
    # front end (frontend_per_token_s) brings the prediction within the two runs' spread
    rows = [r for r in table if r["name"].endswith("decode x384 @ 256 users") and r["model"] == "qwen2.5-7b"
            and "fp8" not in r["name"]]
    assert len(rows) == 2
    measured = sorted(r["output_tokens_per_s_measured"] for r in rows)
    predicted = rows[0]["output_tokens_per_s_predicted"]
    assert measured[0] * 0.95 <= predicted <= measured[1] * 1.05, (measured, predicted)


def test_eager_vs_cuda_graphs_decode_gap(rows, table):
    one = {r["trial"]: r for r in table if r["users"] == 1 and r["workload"] == "uniform"}
    pred = one["eager"]["tpot_mean_s_predicted"] / one["base"]["tpot_mean_s_predicted"]
    rep = {(r["trial"], r["users"]): r["summary"]["tpot_mean_s"]
           for r in read_measurements(DATA / "replicate.jsonl") if r.get("kind") == "load"}
    measured = [one["eager"]["tpot_mean_s_measured"] / one["base"]["tpot_mean_s_measured"],
                rep[("eager", 1)] / rep[("base", 1)]]
    assert min(measured) * 0.9 <= pred <= max(measured) * 1.1, (pred, measured)   # 3.16 in [2.88, 3.43]
    # graphs keep the decode floor at every batch cap (held back: seqs16, mbt1024, mml8k)
    graph = [r for r in table if r["users"] == 1 and r["trial"] in ("seqs16", "mbt1024", "mml8k")]
    err = [abs(r["tpot_mean_s_predicted"] / r["tpot_mean_s_measured"] - 1) for r in graph]
    assert max(err) < 0.03, err


def test_replicate_starts_bound_what_any_model_can_reach(rows, profile):
    """Fresh starts of the same configuration: the noise floor the targets are read against."""
    first = {(r["trial"], r["users"]): r["summary"] for r in read_measurements(DATA / "measurements.jsonl")
             if r.get("kind") == "load"}
    again = [r for r in read_measurements(DATA / "replicate.jsonl") if r.get("kind") == "load"]
    assert len(again) == 9
    diffs = [abs(r["summary"]["output_tokens_per_s"] / first[(r["trial"], r["users"])]["output_tokens_per_s"] - 1)
             for r in again]
    assert float(np.mean(diffs)) < 0.10
    pairs = replicate_pairs(rows, profile["fit"]["excluded"])
    # 8 pairs: q7-base and its fresh restart q7-base-again (5); campaign 2's moe-base against campaign 4's
    # warm moe-warm at 256 users only (its 1- and 64-user probes were cold, excluded; tokens/s 1.02x,
    # no stall over 0.6 s); Nemo's two starts at 1 and 64 users (nemo-base's model folder gave every
    # layer a 4096-token window, which these probes' prompts and outputs never reach)
    by_trials = sorted((a.trial, b.trial) for a, b in pairs)
    assert by_trials == ([("moe-base", "moe-warm")] + [("nemo-base", "nemo-fixed")] * 2
                         + [("q7-base", "q7-base-again")] * 5), by_trials
    assert len(replicate_pairs(rows)) == 10               # without the exclusions the cold MoE probes pair too
    spread = {b.label: b.measured["output_tokens_per_s"] / a.measured["output_tokens_per_s"] for a, b in pairs
              if a.trial == "q7-base"}
    assert spread["decode x384 @ 256 users"] > 1.3          # 35 % apart at 256 users: beyond any target
    assert abs(spread["prefill x256 @ 64 users"] - 1) < 0.03


def test_shipped_constants_carry_intervals_and_say_what_the_data_determined(profile):
    fitted = ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "per_seq_overhead_s", "request_latency_s",
              "frontend_per_token_s", "frontend_per_request_s", "moe_flops_efficiency")
    for name in fitted:
        entry = profile[name]
        lo, hi = entry["ci95"]
        assert lo <= entry["value"] <= hi and entry["determined"] in ("data", "prior"), name
    # with a second model shape (other weight bytes per step) HBM efficiency and the step
    # overhead are told apart: one campaign on one shape left both at their priors (+0.92)
    assert profile["hbm_efficiency"]["determined"] == "data"
    assert profile["flops_efficiency"]["determined"] == "data"
    assert profile["frontend_per_token_s"]["determined"] == "data"
    assert profile["frontend_per_request_s"]["determined"] == "data"
    assert profile["moe_flops_efficiency"]["determined"] == "data"
    assert profile["launch_per_layer_s"]["determined"]["eager"] == "data"
    assert profile["fit"]["reduced_chi2"] < 1.5
    assert profile["memory"]["cudagraph_kv_fraction"] == 0.0   # vLLM 0.26.0 logs graph memory, does not subtract it


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_refit_on_the_committed_data_agrees_with_the_shipped_profile_within_its_intervals(rows, profile):
    """Re-fit on the committed measurements, with the code and libraries as they are, run to
    convergence from the shipped constants (the priors as in the shipped fit): each constant
    stays inside the shipped 95 % interval and the held-back errors are the published ones.
    A simulator or library change that moves this data's optimum fails here, where the
    profile must be fitted again. (From the priors, as ``tuner calibrate`` fits, it takes
    ~190 evaluations instead of a few dozen: ``python benchmarks/fidelity.py --refit``.)"""
    from tuner.calibrate import fit
    from tuner.sim.calibration import load_calibration
    from tuner.sim.hardware import get_gpu

    noise = measurement_noise(rows, read_measurements(DATA / "replicate.jsonl"),
                              pairs=replicate_pairs(rows, profile["fit"]["excluded"]))
    assert noise == pytest.approx(profile["fit"]["noise"], abs=1e-3)
    shipped = load_calibration(get_gpu("H200"), str(DATA / "profile.yaml"))
    res = fit(rows, DEP, fit_points=profile["fit"]["fit_points"], exclude=profile["fit"]["excluded"], noise=noise,
              graph_fraction=0.0, start=shipped)
    est = res.info["step_time"]["estimates"]
    assert res.info["step_time"]["status"] > 0          # converged (scipy: a tolerance was met)
    for name in ("hbm_efficiency", "flops_efficiency", "step_overhead_s", "request_latency_s",
                 "frontend_per_token_s", "frontend_per_request_s", "moe_flops_efficiency"):
        lo, hi = profile[name]["ci95"]
        assert lo <= est[name]["value"] <= hi, (name, est[name]["value"], (lo, hi))
    lo, hi = profile["launch_per_layer_s"]["ci95"]["eager"]
    assert lo <= res.calibration.launch_per_layer_s["eager"] <= hi
    for k in ("output_tokens_per_s_mape", "ttft_p95_s_mape", "tpot_mean_s_mape"):
        assert res.errors["check"][k] == pytest.approx(profile["fit"]["errors"]["check"][k], abs=1.5), k
    for k, v in profile["memory"].items():
        assert res.memory[k] == pytest.approx(v, rel=0.01, abs=1e-6), k
    started = [r for r in res.kv_table if r["measured_ok"]]
    # campaign 3: 2 starts; campaign 4: moe-warm, eager-r1, nemo-fixed, q7-decode-r (l8-gmu014 refused)
    assert len(started) == 21 and max(abs(r["error_pct"]) for r in started) <= 1.0

"""tuner.calibrate: the designed trial set, resumable measurement, the least-squares fits
and the profile that the simulator then finds by GPU and vLLM version."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tuner.backends.sim import SimBackend
from tuner.calibrate import (
    FitResult,
    GiB,
    LoadPoint,
    Startup,
    Trial,
    calibration_workload,
    design_trials,
    fit_memory,
    fit_step_time,
    load_points,
    measure,
    predict_load,
    read_measurements,
    startups,
    write_profile,
)
from tuner.core.errors import ConfigRejected, InputError
from tuner.runtime.progress import Observer
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.calibration import find_profile, load_calibration
from tuner.sim.hardware import get_gpu
from tuner.sim.memory import plan_memory

H200 = Deployment(model="qwen2.5-7b", gpu="H200", vllm_version="0.26.0")
DATA = Path(__file__).resolve().parents[2] / "tuner" / "data" / "calibration" / "h200-vllm-0.26.0"


# ----------------------------------------------------------------------------- design
@pytest.mark.parametrize("gpu", ["H200", "H100-SXM"])
def test_design_spans_the_knobs_and_holds_one_refusal(gpu):
    dep = Deployment(model="qwen2.5-7b", gpu=gpu, vllm_version="0.26.0")
    trials = design_trials(dep)
    loaded = [t for t in trials if t.loads]
    assert len(loaded) >= 8
    assert {t.config.enforce_eager for t in loaded} == {True, False}
    assert len({t.config.gpu_memory_utilization for t in loaded}) >= 4
    assert len({t.config.max_num_seqs for t in loaded}) >= 4
    assert len({t.config.max_num_batched_tokens for t in loaded}) >= 4
    for t in loaded:
        assert t.loads[0] == 1 and len(t.loads) == 3 and t.loads == tuple(sorted(t.loads))
        plan_memory(dep, t.config)                       # the planner accepts every loaded trial
    refusals = [t for t in trials if t.expect_refusal]
    assert len(refusals) == 1
    with pytest.raises(ConfigRejected) as err:
        plan_memory(dep, refusals[0].config)
    assert err.value.kind == "max_model_len"
    # solved for about 55 % of one max-length request: the estimate lands near there
    assert 0.4 < err.value.estimated_max_model_len / refusals[0].config.max_model_len < 0.7


def test_trial_names_and_loads_are_checked():
    with pytest.raises(InputError):
        Trial("two words", ServeConfig())
    with pytest.raises(InputError):
        Trial("x", ServeConfig(), loads=(0,))


def test_workload_rows_are_one_seeded_sequence():
    long = calibration_workload(30)
    part = calibration_workload(10, offset=20)
    assert np.array_equal(part.prompt_tokens, long.prompt_tokens[20:])
    assert np.array_equal(part.output_tokens, long.output_tokens[20:])
    assert long.prompt_tokens.min() >= 128 and long.output_tokens.max() <= 256


# ----------------------------------------------------------------------------- measure
TINY = [
    Trial("small", ServeConfig(gpu_memory_utilization=0.9, max_model_len=4096, max_num_seqs=8), (1, 4)),
    Trial("nope", ServeConfig(gpu_memory_utilization=0.115, max_model_len=32768, enforce_eager=True),
          expect_refusal=True),
]


def test_measure_writes_rows_and_resumes(tmp_path):
    rows = measure(SimBackend(), H200, TINY, tmp_path, meta={"gpu": "H200"})
    kinds = [r["kind"] for r in rows]
    assert kinds.count("trial_end") == 2 and kinds.count("load") == 2 and kinds[0] == "meta"
    st = {s.trial: s for s in startups(rows)}
    assert st["small"].ok and st["small"].kv_cache_tokens > 0
    assert not st["nope"].ok and st["nope"].rejected_kind == "max_model_len"
    assert st["nope"].estimated_max_model_len > 0
    pts = load_points(rows)
    assert [p.users for p in pts] == [1, 4] and pts[1].offset == pts[0].requests
    # a second call finds everything done and adds nothing
    again = measure(SimBackend(), H200, TINY, tmp_path)
    assert len(again) == len(rows) == len(read_measurements(tmp_path))


def test_measure_stops_before_a_trial_that_does_not_fit_the_budget(tmp_path):
    said = []

    class Said(Observer):
        def on_phase(self, text):
            said.append(text)

    rows = measure(SimBackend(), H200, TINY, tmp_path, budget_s=30.0, observer=Said())
    assert rows == [] and "stopping here" in said[-1]


def test_torn_last_line_is_skipped_and_restarted_trials_keep_their_last_attempt(tmp_path):
    good = {"kind": "startup", "trial": "a", "config": ServeConfig().to_dict(), "ok": True, "facts": {}}
    load = {"kind": "load", "trial": "a", "config": ServeConfig().to_dict(), "users": 1, "requests": 2,
            "offset": 0, "ok": True, "summary": {"output_tokens_per_s": 1.0, "ttft_p95_s": 1.0, "tpot_mean_s": 1.0}}
    lines = [good, load, good, load | {"users": 2}]
    (tmp_path / "measurements.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + '\n{"kind": "lo')
    rows = read_measurements(tmp_path)
    assert len(rows) == 4
    assert [p.users for p in load_points(rows)] == [2]


def test_shipped_data_kvlimited_restart_counts_once():
    # kvlimited started twice on the H200 (the first attempt died in the driver): one set of loads
    pts = [p for p in load_points(read_measurements(DATA / "measurements.jsonl")) if p.trial == "kvlimited"]
    assert sorted(p.users for p in pts) == [1, 64, 512]


# ----------------------------------------------------------------------------- fits
def test_memory_fit_recovers_planted_constants(tmp_path):
    """Starts synthesised by the planner with known constants (through a profile) on three
    model shapes are fitted back: the fit's own planner then reproduces every KV size, and
    each shape keeps its own logged load overhead."""
    planted = {"weight_overhead_bytes": 0, "activation_fixed_bytes": int(0.2 * GiB),
               "activation_bytes_per_token_per_hidden": 4.0, "compile_bytes_per_vocab_hidden": 2.0,
               "sampler_bytes_per_logit": 0.0, "cudagraph_kv_fraction": 0.5, "non_torch_bytes": 200 * 2**20,
               "weight_overhead_by_model": {"qwen2.5-7b": int(0.1 * GiB), "llama-3.1-8b": int(0.04 * GiB)}}
    prof = tmp_path / "p.yaml"
    prof.write_text(json.dumps({"memory": planted}))
    cfgs = [ServeConfig(gpu_memory_utilization=g, max_model_len=4096, max_num_seqs=s, max_num_batched_tokens=b,
                        enforce_eager=e)
            for g, s, b, e in [(0.9, 1024, 8192, False), (0.5, 256, 1024, False), (0.7, 128, 512, True),
                               (0.3, 64, 2048, False), (0.9, 512, 4096, True), (0.6, 32, 8192, False)]]
    starts = []
    for model in ("qwen2.5-7b", "llama-3.1-8b", "qwen2.5-14b"):
        dep = Deployment(model=model, gpu="H200", vllm_version="0.26.0", calibration=str(prof))
        for c in cfgs:
            plan = plan_memory(dep, c)
            starts.append(Startup("t", c, True, kv_cache_tokens=plan.kv_cache_tokens, model=model,
                                  available_kv_gib=plan.kv_bytes / GiB, model_load_gib=plan.weight_bytes / GiB))
    memory, info = fit_memory(starts, H200)
    assert info["residual_gib_max"] < 0.01
    assert memory["activation_fixed_bytes"] / GiB == pytest.approx(0.2, abs=0.02)
    assert memory["activation_bytes_per_token_per_hidden"] == pytest.approx(4.0, rel=0.05)
    # the cold compile's vocab x hidden term is told apart from the fixed part by the shapes' vocabularies
    assert memory["compile_bytes_per_vocab_hidden"] == pytest.approx(2.0, rel=0.05)
    assert memory["cudagraph_kv_fraction"] == pytest.approx(0.5, abs=0.05)
    own = memory["weight_overhead_by_model"]
    assert own["qwen2.5-7b"] / GiB == pytest.approx(0.1, abs=1e-3)
    assert own["llama-3.1-8b"] / GiB == pytest.approx(0.04, abs=1e-3)
    assert own["qwen2.5-14b"] == pytest.approx(0, abs=1e3)           # planted none: the fallback, 0
    assert memory["weight_overhead_bytes"] == own["llama-3.1-8b"]      # median over the three shapes


def test_the_planner_takes_a_shapes_own_load_overhead_else_the_median(tmp_path):
    """A shape the profile measured keeps its own "Model loading took" overhead; any other
    shape gets the median: the 7B's 0.105 GiB is not added to a Llama start."""
    prof = tmp_path / "p.yaml"
    prof.write_text(json.dumps({"memory": {"weight_overhead_bytes": int(0.03 * GiB),
                                           "weight_overhead_by_model": {"qwen2.5-7b": int(0.105 * GiB)}}}))
    cfg = ServeConfig(gpu_memory_utilization=0.9, max_model_len=4096)
    bare = {m: plan_memory(Deployment(model=m, gpu="H200", vllm_version="0.26.0", calibration=str(prof)), cfg)
            for m in ("qwen2.5-7b", "llama-3.1-8b")}
    from tuner.sim.model import load_model
    assert bare["qwen2.5-7b"].weight_bytes - load_model("qwen2.5-7b").weight_bytes_per_rank(None, 1) == int(0.105 * GiB)
    assert bare["llama-3.1-8b"].weight_bytes - load_model("llama-3.1-8b").weight_bytes_per_rank(None, 1) == int(0.03 * GiB)  # noqa: E501


def test_memory_fit_needs_a_successful_start():
    with pytest.raises(InputError):
        fit_memory([Startup("r", ServeConfig(), False, rejected_kind="max_model_len")], H200)


def test_step_time_fit_moves_a_wrong_table_to_the_measurements():
    """'Measurements' made by the simulator with the shipped profile; the fit starts from the
    Hopper class table (different constants) and must land within a few percent of them."""
    truth = load_calibration(get_gpu("H200"), vllm_version="0.26.0")
    pts = []
    for users, n in ((1, 3), (8, 16)):
        pt = LoadPoint("t", ServeConfig(gpu_memory_utilization=0.9, max_model_len=4096, max_num_seqs=16),
                       users, n, 0, {})
        pred = predict_load(pt, H200, truth)
        pts.append(LoadPoint(pt.trial, pt.config, users, n, 0,
                             {k: pred[k] for k in ("output_tokens_per_s", "ttft_p95_s", "tpot_mean_s")}))
    start = load_calibration(get_gpu("H200"))                  # the class table
    before = [predict_load(p, H200, start)["ttft_p95_s"] / p.measured["ttft_p95_s"] for p in pts]
    fitted, info = fit_step_time(pts, H200, start, noise={k: 0.02 for k in pts[0].measured})
    after = [predict_load(p, H200, fitted) for p in pts]
    assert max(abs(b - 1) for b in before) > 0.2                # the table misses TTFT (no API latency)
    for p, a in zip(pts, after):
        for k, v in p.measured.items():
            assert a[k] == pytest.approx(v, rel=0.05), (k, a[k], v)
    # the API latency the table lacks is what the data determine, and the truth is inside its interval
    latency = info["estimates"]["request_latency_s"]
    assert latency["determined"] == "data"
    assert latency["ci95"][0] <= truth.request_latency_s <= latency["ci95"][1]


# ----------------------------------------------------------------------------- profile
def test_written_profile_is_found_by_gpu_and_version_and_feeds_the_planner(tmp_path, monkeypatch):
    base = load_calibration(get_gpu("H100-SXM"))
    memory = {"weight_overhead_bytes": int(0.5 * GiB), "activation_fixed_bytes": 0,
              "activation_bytes_per_token_per_hidden": 5.0, "sampler_bytes_per_logit": 4.0,
              "cudagraph_kv_fraction": 1.0, "non_torch_bytes": 200 * 2**20}
    res = FitResult(calibration=base.replace(step_overhead_s=0.00123, request_latency_s=0.004), memory=memory,
                    fit_trials=("a",), check_trials=("b",), table=[], kv_table=[],
                    errors={"check": {"output_tokens_per_s_mape": 1.0}})
    monkeypatch.setenv("TUNER_CALIBRATION_DIR", str(tmp_path))
    dep = Deployment(model="qwen2.5-7b", gpu="H100-SXM", vllm_version="0.19.1")
    before = plan_memory(dep, ServeConfig(gpu_memory_utilization=0.9))
    path = write_profile(res, tmp_path / "h100-vllm-0.19.1" / "profile.yaml", gpu="H100-SXM", vllm_version="0.19.1")
    assert find_profile("h100", "0.19.1") == str(path)
    assert find_profile("H100-SXM", "0.19.2") is None
    calib = load_calibration(get_gpu("H100-SXM"), vllm_version="0.19.1")
    assert calib.step_overhead_s == pytest.approx(0.00123) and calib.request_latency_s == pytest.approx(0.004)
    after = plan_memory(dep, ServeConfig(gpu_memory_utilization=0.9))
    assert after.weight_bytes - before.weight_bytes == int(0.5 * GiB)
    assert after.num_gpu_blocks < before.num_gpu_blocks


def test_report_only_recomputes_the_errors_for_the_constants_as_they_stand(tmp_path):
    # a constant set from other measurements (the MoE layer's, from campaign 5) changes what
    # the profile's report must say; --report-only rewrites the report, never a constant
    import shutil

    import yaml

    from tuner.calibrate import campaign_rows
    from tuner.calibrate.profile import rewrite_report

    folder = tmp_path / "h200"
    shutil.copytree(DATA, folder, ignore=shutil.ignore_patterns("logs"))
    path = folder / "profile.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["moe_layer_s"]["value"] = 0.0          # as before the MoE layers' fixed cost was modelled
    doc["moe_hbm_efficiency"]["value"] = doc["hbm_efficiency"]["value"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    rows = campaign_rows(folder)
    without = rewrite_report(folder, rows, H200, why="MoE terms off")["check"]["output_tokens_per_s_mape"]
    after = yaml.safe_load(path.read_text())
    assert after["moe_layer_s"]["value"] == 0.0 and after["fit"]["report"] == "MoE terms off"
    assert after["fit"]["errors"]["check"]["output_tokens_per_s_mape"] == pytest.approx(without, abs=1e-3)
    shipped = yaml.safe_load((DATA / "profile.yaml").read_text())
    for name in ("moe_layer_s", "moe_hbm_efficiency"):
        after[name]["value"] = shipped[name]["value"]
    path.write_text(yaml.safe_dump(after, sort_keys=False))
    with_moe = rewrite_report(folder, rows, H200, why="MoE terms on")["check"]["output_tokens_per_s_mape"]
    # the held-back MoE 1-user mix alone moves the held-back MAPE by about a point (53 % -> 2 %)
    assert without > 5.0 >= with_moe
    assert with_moe == pytest.approx(shipped["fit"]["errors"]["check"]["output_tokens_per_s_mape"], abs=1e-3)
    assert yaml.safe_load(path.read_text())["hbm_efficiency"] == shipped["hbm_efficiency"]


def test_report_only_without_a_profile_says_so(tmp_path, capsys):
    from tuner.cli import main

    try:
        main(["calibrate", "--model", "qwen2.5-7b", "--gpu", "H200", "--vllm-version", "0.26.0",
              "--out", str(tmp_path), "--report-only", "why"])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    assert code != 0 and "no profile to report on" in out + err and "profile.yaml" in out + err


def test_a_bad_starts_is_refused_before_anything_is_measured(tmp_path, capsys):
    """--starts is read with the other flags: a run that would measure for minutes and then
    refuse to fit stops at once, with nothing written."""
    from tuner.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["calibrate", "--model", "qwen2.5-7b", "--gpu", "L4", "--backend", "sim", "--trials", "base",
              "--starts", "0", "--out", str(tmp_path / "profile")])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and "--starts must be >= 1" in out + err
    assert not (tmp_path / "profile").exists()


def test_a_server_faster_than_real_time_is_measured_in_its_gpus_time(tmp_path):
    """tuner sim-serve --speed N runs N times faster than the GPU it simulates: calibrate's rows
    hold the GPU's times (N times what the clock read), as tuner plan reports them."""

    class Faster(SimBackend):
        time_scale = 4.0

    plain = load_points(measure(SimBackend(), H200, TINY, tmp_path / "plain"))
    fast = load_points(measure(Faster(), H200, TINY, tmp_path / "fast"))
    for a, b in zip(plain, fast):
        assert b.measured["ttft_p95_s"] == pytest.approx(4 * a.measured["ttft_p95_s"])
        assert b.measured["output_tokens_per_s"] == pytest.approx(a.measured["output_tokens_per_s"] / 4)

"""The fidelity gate over every committed real H200 measurement: no shape group's raw error
may grow past its noise (tuner.calibrate.gate; table tuner/data/calibration/h200-vllm-0.26.0/fidelity_gate.csv)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuner.calibrate import LoadPoint, campaign_rows, compare_loads, load_points, point_name
from tuner.calibrate.gate import TABLE, group_errors, group_of, noise_pairs, read_table, regressions
from tuner.serving.config import Deployment, ServeConfig
from tuner.sim.calibration import load_calibration
from tuner.sim.hardware import get_gpu

DATA = Path(__file__).resolve().parents[1] / "tuner" / "data" / "calibration" / "h200-vllm-0.26.0"
DEP = Deployment(model="qwen2.5-7b", gpu="H200", vllm_version="0.26.0")


@pytest.fixture(scope="module")
def setup():
    profile = yaml.safe_load((DATA / "profile.yaml").read_text())
    rows = campaign_rows(DATA)
    excluded = set(profile["fit"].get("excluded") or [])
    points = [p for p in load_points(rows) if point_name(p) not in excluded]
    return points, noise_pairs(DATA, rows), set(profile["fit"]["fit_points"])


def errors(setup, calib=None):
    points, pairs, fitted = setup
    return group_errors(points, compare_loads(points, DEP, calib), pairs, fitted)


def test_no_group_is_worse_than_the_committed_table(setup):
    bad = regressions(errors(setup), read_table(DATA / TABLE))
    assert not bad, "fidelity gate: " + "; ".join(bad)


def test_a_worsened_constant_fails_the_gate_naming_the_groups(setup):
    shipped = load_calibration(get_gpu("H200"), str(DATA / "profile.yaml"))
    worse = shipped.replace(frontend_per_token_s=shipped.frontend_per_token_s * 1.3)
    bad = regressions(errors(setup, worse), read_table(DATA / TABLE))
    assert bad and all(": " in line and "committed" in line for line in bad)


def test_the_moe_layers_fixed_cost_is_held_by_the_gate(setup):
    # campaign 5's term (an H100 fit, carried to the H200): off or doubled, the MoE groups the
    # H200 measured get worse than the committed table by more than their noise, the dense ones do not
    shipped = load_calibration(get_gpu("H200"), str(DATA / "profile.yaml"))
    assert shipped.moe_layer_s > 0 and shipped.moe_hbm_efficiency
    for worse in (shipped.replace(moe_layer_s=0.0), shipped.replace(moe_layer_s=2 * shipped.moe_layer_s)):
        bad = regressions(errors(setup, worse), read_table(DATA / TABLE))
        assert any(line.startswith("MoE mix closed 1 bf16: tokens/s") for line in bad), bad
        assert all(line.startswith("MoE ") for line in bad), bad


def test_campaign_rows_read_every_campaign_file_and_folder_in_order(tmp_path):
    for rel, trial in (("measurements.jsonl", "c1"), ("campaign2.jsonl", "c2"),
                       ("campaign3/measurements.jsonl", "c3"), ("replicate.jsonl", "again")):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(json.dumps({"kind": "trial_end", "trial": trial}) + "\n")
    (tmp_path / "campaign4").mkdir()  # a campaign folder with nothing measured yet
    assert [r["trial"] for r in campaign_rows(tmp_path)] == ["c1", "c2", "c3"]


def test_the_gate_covers_the_held_back_architectures(setup):
    points, _, fitted = setup
    groups = {group_of(p) for p in points}
    for model in ("Llama8B", "Nemo12B"):
        mine = [p for p in points if group_of(p).startswith(model + " ")]
        assert len(mine) >= 6 and not any(point_name(p) in fitted or p.trial in fitted for p in mine)
    assert {g.group for g in read_table(DATA / TABLE)} == groups


def test_groups_split_by_shape_not_by_trial():
    cfg = ServeConfig(gpu_memory_utilization=0.9, max_model_len=32768)
    mk = lambda users, **kw: LoadPoint("t", kw.pop("config", cfg), users, 10, 0, {}, **kw)  # noqa: E731
    assert group_of(mk(1)) == "7B uniform closed 1 bf16"
    assert group_of(mk(64)) == group_of(mk(17)) != group_of(mk(65))
    assert group_of(mk(8, config=cfg.replace(kv_cache_dtype="fp8"))).endswith("fp8")
    shared = {"kind": "trace", "trace": "mooncake_fast25_synthetic", "groups": 4}
    a = group_of(mk(8, workload=shared, load={"kind": "concurrency", "users": 8}))
    b = group_of(mk(8, workload={**shared, "unique_prefixes": True}, load={"kind": "concurrency", "users": 8}))
    assert a.endswith("shared prefixes") and b.endswith("unique prefixes")
    bursty = group_of(mk(0, workload={"kind": "mix"}, load={"kind": "poisson", "rate": 32.0, "burstiness": 0.25}))
    assert bursty == "7B mix open bursty bf16"


# The must-show on the committed leave-one-shape-out columns (python benchmarks/fidelity_gate.py
# --loso --write; a group the fit never saw is held back already): the figures as a point-weighted mean.
def loso(key):
    groups = read_table(DATA / TABLE)
    return sum(getattr(g, key) * g.points for g in groups) / sum(g.points for g in groups), groups


def test_leave_one_shape_out_p95_ttft_within_15_percent():
    mean, _ = loso("ttft_p95_loso")
    assert mean <= 15.0   # achieved 12.1 % over 83 points


@pytest.mark.xfail(strict=True, reason="leave-one-shape-out tokens/s MAPE 5.1 % measured against the 5 % target: "
                   "7B eager 1 user 28 % and 17-64 users 26 % (four starts of one probe 11-23 ms), see README")
def test_leave_one_shape_out_tokens_per_s_within_5_percent():
    mean, _ = loso("tokens_per_s_loso")
    assert mean <= 5.0


@pytest.mark.xfail(strict=True, reason="5 groups past 8 % leave-one-shape-out tokens/s, worst 7B eager 1 user "
                   "28 % (the host's kernel launches differ by start), see README")
def test_leave_one_shape_out_tokens_per_s_within_8_percent_in_every_group():
    _, groups = loso("tokens_per_s_loso")
    assert not [g.group for g in groups if g.tokens_per_s_loso > 8.0]

"""``tuner plan --fleet``: the kinds side by side with their truth and bands, the options, the
calibrate hint where the band decides, JSON for scripts, progress on stderr, and one-line refusals of
what does not go with a fleet."""
from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

import tuner.cli.progress as progress

FLEET = """\
name: two-kinds
model: qwen2.5-7b
search: {budget: 3, requests: 200}
kinds:
  RTX-4090: {count: 2, gpu_hour_cost: 0.45}
  H100-SXM: {count: unlimited, gpu_hour_cost: 2.49}
"""
ARGS = ["--slo", "p95:ttft<=5s", "--tokens-per-conversation", "300"]


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.yaml").write_text(FLEET)
    return str(tmp_path / "two.yaml")


@pytest.mark.slow
def test_json_then_text_where_an_uncalibrated_band_decides(fleet, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(progress, "shown", lambda: True)
    code, out, err = run_cli(["plan", "--fleet", fleet, "--demand", "3000/min", *ARGS, "--output", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)                                   # stdout is one JSON object while the bar draws
    assert "kinds" in err and "left" in err
    kinds = {k["label"]: k for k in data["kinds"]}
    assert data["options"][0]["why"] == "cheapest" and data["need_per_min"] == pytest.approx(3600)
    assert kinds["RTX-4090"]["band"]["floor"] and kinds["H100-SXM"]["config"]["tensor_parallel_size"] == 1
    assert (tmp_path / "studies" / "fleet-two-kinds" / "fleet-plan.json").is_file()
    # a demand the two 4090 engines hold at their prediction but not at the low end of their band
    g = kinds["RTX-4090"]
    per_min = g["capacity"]["conversations_per_min"]
    demand = 2 * per_min * (1 - g["band"]["tokens_per_s"] / 2) / 1.2
    monkeypatch.setattr(progress, "shown", lambda: False)
    code, out, err = run_cli(["plan", "--fleet", fleet, "--demand", f"{demand:.1f}/min", *ARGS], capsys)
    assert code == 0, err
    out = " ".join(out.split())                              # the words, whatever the terminal's width wrapped
    assert "NOT CALIBRATED: run `tuner calibrate` on one of these GPUs: RTX-4090" in out
    assert "band: tokens/s >=13 %" in out and "NOT CALIBRATED (ada)" in out
    assert "2 x RTX-4090" in out and "tied under the bands with #2" in out
    assert "compute capability 8.9" in out and "ceilings at TP" in out and "took" in out


@pytest.mark.parametrize("flags, words", [
    (["--gpu", "H100-SXM"], "--gpu does not go with --fleet: the fleet file names the GPUs"),
    (["--gpu-hour-cost", "2"], "--gpu-hour-cost does not go with --fleet: the fleet file gives each kind's price"),
    (["--backend", "vllm"], "--backend: a fleet plan runs on the simulator"),
    (["--study", "s"], "--study does not go with --fleet"),
])
def test_what_does_not_go_with_a_fleet_is_one_line(fleet, capsys, flags, words):
    code, _, err = run_cli(["plan", "--fleet", fleet, "--demand", "10/min", *flags], capsys)
    assert code == 2 and words in err and "Traceback" not in err


def test_a_fleet_needs_a_demand_and_a_good_file(fleet, tmp_path, capsys):
    code, _, err = run_cli(["plan", "--fleet", fleet], capsys)
    assert code == 2 and "--fleet needs --demand" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(FLEET.replace("count: 2", "count: lots"))
    code, _, err = run_cli(["plan", "--fleet", str(bad), "--demand", "10/min"], capsys)
    assert code == 2 and f"{bad}:5: kinds.RTX-4090.count must be a number of GPUs" in err


@pytest.mark.slow
def test_an_inventory_that_cannot_hold_the_demand_exits_3(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "small.yaml").write_text(FLEET.replace("  H100-SXM: {count: unlimited, gpu_hour_cost: 2.49}\n", ""))
    code, out, err = run_cli(["plan", "--fleet", "small.yaml", "--demand", "100000/min", *ARGS], capsys)
    err = " ".join(err.split())
    assert code == 3 and "no deployment within the inventory holds 120,000 conversations/min" in err
    assert "RTX-4090" in out                                   # the kind's figures are still shown

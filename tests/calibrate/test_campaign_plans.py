"""The H200 campaigns' plans (benchmarks/h200/campaign.py): a probe is named by its label in
the rows, the resumption and excluded_points.txt, so two probes of one trial must differ."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "h200" / "campaign.py"


@pytest.fixture(scope="module")
def campaign():
    spec = importlib.util.spec_from_file_location("h200_campaign", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_probe_of_a_trial_has_its_own_label(campaign):
    for number, plan in campaign.PLANS.items():
        for trial in plan():
            labels = [p.label for p in trial.probes]
            assert len(labels) == len(set(labels)), (number, trial.name, labels)


def test_campaign_5_warms_each_batch_before_measuring_it(campaign, tmp_path):
    _number, trials = campaign.read_plan(campaign.write_plan(campaign.PLANS["5"](), tmp_path, 5))
    moe = next(t for t in trials if t.name == "moe-small")
    users = [p.load["users"] for p in moe.probes]
    first_data = [p.label for p in moe.probes].index("decode x3 @ 1 users")
    # every concurrency measured after the warm-ups was run once before them
    assert set(users[first_data:]) <= set(users[:first_data])
    assert sorted({p.load["users"] for p in moe.probes[first_data:] if p.workload["kind"] == "decode"}) == \
        [1, 2, 4, 8, 16, 32]


def test_a_plan_carries_its_campaign_number_though_plans_share_trial_names(campaign, tmp_path):
    # plan 4 and plan 6 both have a trial "q7-decode-r": the name cannot say which campaign ran
    assert {t.name for t in campaign.PLANS["4"]()} & {t.name for t in campaign.PLANS["6"]()}
    for number in ("4", "6"):
        got, trials = campaign.read_plan(campaign.write_plan(campaign.PLANS[number](), tmp_path / number, int(number)))
        assert got == int(number)
        assert [t.name for t in trials] == [t.name for t in campaign.PLANS[number]()]
    # a plan written before plans carried their number (a bare list) still reads, with none
    old = tmp_path / "old.json"
    old.write_text(json.dumps(json.loads((tmp_path / "6" / "plan.json").read_text())["trials"]))
    got, trials = campaign.read_plan(old)
    assert got is None and trials[0].name == campaign.PLANS["6"]()[0].name

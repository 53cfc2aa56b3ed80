"""tuner.fleet.plan_fleet on a small mixed fleet: each kind searched and swept on the simulator, the
cheapest deployment a mix where the arithmetic says so, ties under the bands with the calibrate hint,
and the record that notebooks read back."""
from __future__ import annotations

import itertools
import json
import math

import pytest

from tuner.fleet.kinds import Traffic
from tuner.fleet.planner import plan_fleet, solve
from tuner.fleet.record import FleetPlan, load_fleet
from tuner.serving.demand import parse_demand

FLEET = """\
name: two-kinds
model: qwen2.5-7b
search: {budget: 3, requests: 200}
kinds:
  RTX-4090: {count: 2, gpu_hour_cost: 0.45}
  H100-SXM: {count: unlimited, gpu_hour_cost: 2.49}
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fleet")
    (folder / "two.yaml").write_text(FLEET)
    plan = plan_fleet(folder / "two.yaml", "3000/min", slos=("p95:ttft<=5s",), tokens_per_conversation=300,
                      folder=folder / "out")
    return plan, folder


def _brute(plan: FleetPlan) -> tuple[float, dict[str, int]]:
    """The cheapest deployment by trying every count the inventory allows (H100s up to 10)."""
    kinds = [k for k in plan.kinds if k.feasible]
    ranges = [range((k.engines_available if k.engines_available is not None else 10) + 1) for k in kinds]
    best = (math.inf, {})
    for counts in itertools.product(*ranges):
        if sum(n * k.per_min() for n, k in zip(counts, kinds)) >= plan.need_per_min:
            cost = sum(n * k.engine_cost for n, k in zip(counts, kinds))
            if cost < best[0] - 1e-9:
                best = (cost, {k.label: n for k, n in zip(kinds, counts)})
    return best


def test_each_kind_gets_flags_a_layout_a_capacity_and_a_band(planned):
    plan, _ = planned
    gpu4090, h100 = plan.kinds
    for k in plan.kinds:
        assert k.feasible and k.config and k.tp and k.study and k.trials == 3
        assert k.capacity["ttft_p95_s"] <= 5.0 and k.capacity["tokens_per_conversation"] == 300
        # a conversation is 300 tokens: an engine's conversations/min is its tokens/s x 60 / 300
        assert k.per_min() == pytest.approx(k.capacity["tokens_per_s"] * 60 / 300)
        assert k.cost_per_million_tokens == pytest.approx(k.engine_cost / (k.capacity["tokens_per_s"] * 3600) * 1e6)
        assert k.capacity["tokens_per_s"] < k.ceiling.compute_tokens_per_s          # under the physical ceilings
        assert k.decode_one_user < k.ceiling.decode_tokens_per_s
        assert set(k.timings) == {"truth", "search", "layout", "capacity"}
    assert gpu4090.band.floor and not gpu4090.band.calibrated and not h100.band.floor
    assert gpu4090.engines_available == 2 // gpu4090.tp and h100.engines_available is None


def test_the_cheapest_deployment_is_the_arithmetic_one(planned):
    plan, _ = planned
    cost, engines = _brute(plan)
    assert plan.best.cost_per_hour == pytest.approx(cost)
    assert {k: n for k, n in plan.best.engines.items() if n} == {k: n for k, n in engines.items() if n}
    assert plan.best.capacity >= plan.need_per_min == pytest.approx(3600.0)


def test_a_demand_just_above_one_h100_is_served_by_a_mix(planned):
    plan, _ = planned
    gpu4090, h100 = plan.kinds
    # one H100 engine plus a tenth: two H100s (2 x 2.49) or one H100 and one 4090 engine (2.49 + 0.45 x its GPUs)
    extra = 0.1 * h100.per_min()
    assert extra < gpu4090.per_min()
    demand = parse_demand((h100.per_min() + extra) / 1.2)
    mixed = solve(_fleet(plan), plan.kinds, Traffic(slos=plan.slos, demand=demand, tokens_per_conversation=300))
    assert mixed.best.engines == {"RTX-4090": 1, "H100-SXM": 1}
    assert mixed.best.cost_per_hour == pytest.approx(2.49 + 0.45 * gpu4090.tp)
    assert mixed.best.cost_per_hour < 2 * 2.49
    assert mixed.best.cost_per_hour == pytest.approx(_brute(mixed)[0])
    assert [m.why for m in mixed.options][:2] == ["cheapest", "without RTX-4090"]


def test_where_the_band_decides_the_plan_says_calibrate(planned):
    plan, _ = planned
    gpu4090, h100 = plan.kinds
    # both 4090 engines hold the demand at their prediction, not at the low end of their band:
    # cheaper than an H100, or not enough: a tie, decided by an uncalibrated kind
    need = 2 * gpu4090.per_min() * (1 - gpu4090.band.tokens_per_s / 2)
    tie = solve(_fleet(plan), plan.kinds, Traffic(slos=plan.slos, demand=parse_demand(need / 1.2),
                                                  tokens_per_conversation=300))
    assert tie.best.engines["RTX-4090"] == 2 and math.isinf(tie.best.cost_range[1])
    assert tie.ties and tie.calibrate_hint == "NOT CALIBRATED: run `tuner calibrate` on one of these GPUs: RTX-4090"
    # at a demand both ends of the band hold, no tie and no hint
    easy = solve(_fleet(plan), plan.kinds, Traffic(slos=plan.slos, demand=parse_demand(100 / 1.2),
                                                   tokens_per_conversation=300))
    assert easy.best.engines["RTX-4090"] == 1 and not easy.ties and easy.calibrate_hint is None


def test_the_record_reads_back_and_the_figure_is_written(planned):
    plan, folder = planned
    again = load_fleet(folder / "out")
    assert again.to_dict() == json.loads(json.dumps(plan.to_dict()))
    assert again.best.engines == plan.best.engines and again.kinds[0].band == plan.kinds[0].band
    assert (folder / "out" / "fleet-plan.png").read_bytes()[:4] == b"\x89PNG"
    assert (folder / "out" / "studies.db").is_file() and plan.storage.endswith("studies.db")


def _fleet(plan: FleetPlan):
    from tuner.fleet.inventory import Fleet

    return Fleet.from_dict(plan.fleet)

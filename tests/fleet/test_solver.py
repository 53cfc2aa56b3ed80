"""tuner.fleet.solver: the cheapest deployment within the inventory, by the integer program, checked
by hand-worked arithmetic and against brute force over every deployment the inventory allows."""
from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.core.errors import InputError
from tuner.fleet.bands import overlap
from tuner.fleet.solver import Unit, cheapest, most_capacity, options, with_range


def test_the_cheapest_answer_is_a_mix_by_hand():
    # 3,000 conversations/min with 20 % headroom: 3,600/min to provision.
    # rented H100: 1,000/min an engine at 2.50/h, unlimited; owned L4 pairs: 700/min at 1.20/h, two of them.
    #   H100 alone:      ceil(3600 / 1000) = 4 engines            = 10.00/h
    #   L4 alone:        2 x 700 = 1,400/min < 3,600: not enough
    #   both L4 + H100s: 1,400 + 3 x 1,000 = 4,400 (2 H100: 3,400, short) = 2 x 1.20 + 3 x 2.50 = 9.90/h
    #   one L4 + H100s:    700 + 3 x 1,000 = 3,700 >= 3,600               = 1.20 + 7.50      = 8.70/h
    # so the cheapest is a mix, and not "every cheap engine first" (9.90).
    units = [Unit("H100", 1000.0, 2.50), Unit("L4", 700.0, 1.20, available=2, gpus=2)]
    best = cheapest(units, 3000 * 1.2)
    assert best.engines == {"H100": 3, "L4": 1}
    assert best.cost_per_hour == pytest.approx(8.70) and best.capacity == pytest.approx(3700.0)
    assert best.gpus == {"H100": 3, "L4": 2}
    found = options(units, 3000 * 1.2)
    assert [(m.why, m.engines, round(m.cost_per_hour, 2)) for m in found] == [
        ("cheapest", {"H100": 3, "L4": 1}, 8.70), ("without L4", {"H100": 4, "L4": 0}, 10.00)]


def test_equal_cost_takes_the_fewest_engines_and_no_demand_costs_nothing():
    # two engines of 500/min or one of 1,000/min, both 2.00/h for 1,000/min
    units = [Unit("small", 500.0, 1.0), Unit("big", 1000.0, 2.0)]
    assert cheapest(units, 1000.0).engines == {"small": 0, "big": 1}
    assert cheapest(units, 0.0).cost_per_hour == 0.0


def test_an_inventory_too_small_has_no_answer():
    units = [Unit("V100", 250.0, 0.15, available=8), Unit("T4", 400.0, 0.4, available=2)]
    assert most_capacity(units) == pytest.approx(8 * 250 + 2 * 400)
    assert cheapest(units, 2801.0) is None and options(units, 2801.0) == []
    assert cheapest(units, 2800.0).engines == {"V100": 8, "T4": 2}
    assert most_capacity([*units, Unit("H100", 1.0, 1.0)]) == math.inf


def test_bands_give_a_cost_range_and_overlapping_ranges_tie():
    # 2,000/min: two A engines (1,000/min, 1.00/h) or one B (2,100/min, 2.10/h).
    # With A's capacity 10 % low, two A hold 1,800 < 2,000: three (3.00); 10 % high: still two (2.00).
    units = [Unit("A", 1000.0, 1.0, band=0.10), Unit("B", 2100.0, 2.1, band=0.02)]
    found = options(units, 2000.0)
    assert [m.text() for m in found] == ["2 x A", "1 x B"]
    assert found[0].cost_range == pytest.approx((2.0, 3.0))
    assert found[1].cost_range == pytest.approx((2.1, 2.1))   # 2,100 x 0.98 = 2,058 still holds 2,000
    assert overlap(found[0].cost_range, found[1].cost_range)
    narrow = with_range(found[0], [Unit("A", 1000.0, 1.0, band=0.0), units[1]], 2000.0)
    assert narrow.cost_range == pytest.approx((2.0, 2.0)) and not overlap(narrow.cost_range, (2.5, 3.0))


def test_a_unit_must_make_sense():
    with pytest.raises(InputError, match="capacity must be > 0"):
        Unit("x", 0.0, 1.0)
    with pytest.raises(InputError, match="band must be in"):
        Unit("x", 1.0, 1.0, band=1.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(50, 3000), st.integers(0, 500), st.integers(0, 4)), min_size=1, max_size=3),
       st.integers(1, 6000))
def test_the_integer_program_is_as_cheap_as_brute_force(kinds, need):
    units = [Unit(f"k{i}", float(cap), cost / 100.0, available=avail) for i, (cap, cost, avail) in enumerate(kinds)]
    best = None
    for counts in itertools.product(*(range(u.available + 1) for u in units)):
        if sum(n * u.capacity for n, u in zip(counts, units)) >= need:
            cost = sum(n * u.cost for n, u in zip(counts, units))
            best = cost if best is None else min(best, cost)
    found = cheapest(units, float(need))
    if best is None:
        assert found is None
    else:
        assert found is not None and found.cost_per_hour == pytest.approx(best, abs=1e-9)
        assert found.capacity >= need
        assert all(found.engines[u.label] <= u.available for u in units)

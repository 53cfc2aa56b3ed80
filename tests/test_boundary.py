"""The noise of one measurement of the objective (tokens/s at the edge) on a fresh start:
a start's TTFT factor moves the edge along the configuration's own P95-vs-load curve."""
from __future__ import annotations

import math

import numpy as np
import pytest
from fakes import Analytic, small_workload

from tuner.search import evaluate_config
from tuner.search.boundary import edge_slope, objective_sd, study_objective_sd
from tuner.serving.config import Deployment, ServeConfig
from tuner.study.race import prior_sd, ttft_sd
from tuner.study.record import LoadRecord, TrialRecord


def _rec(*points: tuple[float, float, float, bool], stopped: float | None = None) -> TrialRecord:
    """A record whose loads are (level, P95 s, tokens/s, passed); the load at ``stopped`` stopped early."""
    return TrialRecord(loads=tuple(LoadRecord(level=lv, p95_ttft_s=p, tokens_per_s=t, passed=ok,
                                              stopped_early=lv == stopped) for lv, p, t, ok in points))


def test_the_slope_is_the_chord_from_the_edge_to_the_failing_load_above_it():
    # P95 x 1.21 for tokens/s x 1.1 from the edge (10 users) to the failing load (12):
    # d log tokens / d log P95 = log 1.1 / log 1.21 = 0.5
    rec = _rec((10, 1.0, 1000.0, True), (12, 1.21, 1100.0, False))
    assert edge_slope(rec) == pytest.approx(0.5)
    # tokens/s noise and the edge's move with a 10 % TTFT factor, independent
    assert objective_sd(rec, simulated=False) == pytest.approx(math.hypot(0.02, 0.5 * 0.10))


def test_an_edge_held_at_its_cap_or_never_passed_does_not_move_with_a_start():
    held = _rec((8, 0.5, 800.0, True), (16, 0.8, 1500.0, True))  # nothing failed above
    missed = _rec((1, 3.0, 100.0, False))
    for rec in (held, missed):
        assert edge_slope(rec) is None
        assert objective_sd(rec, simulated=False) == prior_sd(False)


def test_a_saturated_server_gains_no_tokens_past_its_edge():
    rec = _rec((10, 1.0, 1000.0, True), (12, 1.5, 1000.0, False))
    assert edge_slope(rec) == 0.0 and objective_sd(rec, simulated=True) == prior_sd(True)


def test_a_failing_replay_stopped_early_is_read_by_its_load_not_its_partial_tokens():
    # stopped early, its tokens/s counts only the requests done by then (here: far lower)
    rec = _rec((10, 1.0, 1000.0, True), (12, 1.44, 300.0, False), stopped=12)
    assert edge_slope(rec) == pytest.approx(math.log(1.2) / math.log(1.44))


def test_a_curve_measured_far_below_the_edge_does_not_widen_the_noise():
    # below the edge P95 hardly moves with load (steep chord); past it, the edge's own
    flat_below = _rec((2, 0.9, 200.0, True), (10, 1.0, 1000.0, True), (12, 1.21, 1100.0, False))
    assert edge_slope(flat_below) == pytest.approx(0.5)


def test_steeper_gains_past_the_edge_mean_a_noisier_objective_and_the_study_takes_the_median():
    recs = [_rec((10, 1.0, 1000.0, True), (12, 1.21, 1000.0 * g, False)) for g in (1.0, 1.05, 1.1, 1.2)]
    sds = [objective_sd(r, simulated=False) for r in recs]
    assert sds == sorted(sds) and sds[0] < sds[-1]
    assert study_objective_sd(recs, simulated=False) == pytest.approx(np.median(sds))
    assert study_objective_sd([], simulated=False) == prior_sd(False)


@pytest.mark.parametrize("power, slope", [(1.0, 1.0), (2.0, 0.5)])
def test_measured_on_a_server_whose_p95_grows_as_a_power_of_the_load(power, slope):
    """Hand-worked: tokens/s = 100 x users and P95 = c x users^power, so along the curve
    d log tokens / d log P95 = 1 / power for any two loads; and a start whose TTFTs run x f
    moves the edge's tokens/s by f^(-1/power): the noise of the objective is its TTFT noise / power.
    (c puts the edge near 60 users, where one user is a small step.)"""
    target = 2.0
    c = target / 60**power
    ev = evaluate_config(Analytic(lambda u: c * u**power), Deployment(), ServeConfig(max_num_seqs=256),
                         small_workload(n=400), target, early_stop=False)
    assert ev.feasible and ev.record.edge is not None and ev.record.edge.failing_level is not None
    assert edge_slope(ev.record) == pytest.approx(slope, rel=1e-6)
    values = []
    for f in (0.9, 1.0, 1.1):  # the same server, its TTFTs x f
        lucky = evaluate_config(Analytic(lambda u, f=f: f * c * u**power), Deployment(),
                                ServeConfig(max_num_seqs=256), small_workload(n=400), target, early_stop=False,
                                edge_tolerance=0.01, max_replays=12)
        values.append(lucky.value)
    moved = math.log(values[0] / values[2]) / math.log(1.1 / 0.9)
    assert moved == pytest.approx(slope, abs=0.15)
    assert ttft_sd(False) * slope < objective_sd(ev.record, simulated=False) <= math.hypot(prior_sd(False),
                                                                                           ttft_sd(False) * slope)

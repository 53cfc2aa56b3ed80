"""tuner.calibrate.estimation.fit_map: the MAP estimate and its intervals on cases worked by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.calibrate.estimation import Param, fit_map, prior_starts


def test_one_measurement_and_one_prior_of_equal_weight_meet_halfway():
    # y = 2 measured with noise 1; prior 0 with sd 1: the posterior is N(1, 1/2)
    p = Param("a", 1.0, -10.0, 10.0, prior=0.0, prior_sd=1.0)
    out = fit_map(lambda x: np.array([(x[0] - 2.0) / 1.0]), [p])
    e = out.estimate("a")
    assert e.value == pytest.approx(1.0, abs=1e-6)
    assert e.sd == pytest.approx(1 / math.sqrt(2), rel=1e-3)
    assert e.low95 == pytest.approx(1 - 1.96 / math.sqrt(2), abs=2e-3)
    assert e.determined is False          # the data halved the variance, not more: sd/prior_sd = 0.71


def test_a_well_measured_constant_is_determined_and_keeps_its_units():
    # slope of a line through 5 points with noise 1e-4, fitted in units of 1e-3 (the prior, sd
    # 0.01 in the slope's own units, weighs nothing beside the data's 3e-5)
    t = np.arange(5.0)
    y = 3e-3 * t + 0.5
    p = [Param("intercept", 1.0, -5, 5, 0.0, 10.0), Param("slope", 1e-3, -50, 50, 0.0, 10.0)]
    out = fit_map(lambda x: (x[0] + x[1] * 1e-3 * t - y) / 1e-4, p)
    slope = out.estimate("slope")
    assert slope.value == pytest.approx(3e-3, rel=1e-4)
    assert slope.determined and slope.contains(3e-3)
    # least squares slope sd: sigma / sqrt(sum((t - mean t)^2)) = 1e-4 / sqrt(10)
    assert slope.sd == pytest.approx(1e-4 / math.sqrt(10), rel=0.02)


def test_a_constant_no_measurement_sees_stays_at_its_prior():
    p = [Param("seen", 1.0, -5, 5, 0.0, 1.0), Param("unseen", 1.0, -5, 5, 0.7, 0.2)]
    out = fit_map(lambda x: np.array([(x[0] - 1.5) / 0.01, (x[0] - 1.5) / 0.01]), p)
    unseen = out.estimate("unseen")
    assert unseen.value == pytest.approx(0.7, abs=1e-6)
    assert unseen.sd == pytest.approx(0.2, rel=1e-3) and not unseen.determined
    assert out.estimate("seen").determined


def test_constants_seen_only_as_a_sum_are_reported_as_correlated():
    # the data measure a + b = 1 precisely; a and b alone only through their priors
    p = [Param("a", 1.0, -5, 5, 0.0, 1.0), Param("b", 1.0, -5, 5, 0.0, 1.0)]
    out = fit_map(lambda x: np.array([(x[0] + x[1] - 1.0) / 1e-3]), p)
    a, b = out.estimate("a"), out.estimate("b")
    assert a.value == pytest.approx(0.5, abs=1e-4) and b.value == pytest.approx(0.5, abs=1e-4)
    assert not a.determined and not b.determined
    (name_a, name_b, rho), = out.info["correlated"]
    assert {name_a, name_b} == {"a", "b"} and rho < -0.99


def test_residuals_larger_than_the_noise_widen_the_intervals():
    t = np.linspace(0, 1, 20)
    rng = np.random.default_rng(0)
    y = 2.0 * t + rng.normal(0, 0.1, t.size)          # real noise 0.1
    p = [Param("slope", 1.0, -10, 10, 0.0, 100.0)]
    honest = fit_map(lambda x: (x[0] * t - y) / 0.1, p)
    claims_less = fit_map(lambda x: (x[0] * t - y) / 0.01, p)   # stated noise 10x too small
    assert honest.info["interval_inflation"] == pytest.approx(1.0, abs=0.6)
    assert claims_less.info["reduced_chi2"] > 50
    ratio = claims_less.estimate("slope").sd / honest.estimate("slope").sd
    assert 0.5 < ratio < 2.0      # widened back to what the scatter says, not 10x too narrow


def test_a_bound_clips_the_interval_and_is_flagged():
    p = [Param("eff", 1.0, 0.3, 1.0, 0.8, 0.1)]
    out = fit_map(lambda x: np.array([(x[0] - 1.4) / 0.01]), p)
    e = out.estimate("eff")
    assert e.value == pytest.approx(1.0) and e.at_bound and e.high95 == pytest.approx(1.0)


def test_starts_from_the_priors_find_the_same_optimum():
    p = [Param("a", 1.0, -5, 5, 0.0, 1.0), Param("b", 1.0, -5, 5, 1.0, 1.0)]
    starts = prior_starts(p, 4, seed=3)
    assert len(starts) == 4 and np.array_equal(starts[0], [0.0, 1.0])
    out = fit_map(lambda x: np.array([(x[0] - 2) / 0.1, (x[1] + 1) / 0.1, (x[0] * x[1] + 2) / 0.1]), p,
                  starts=starts)
    assert out.info["starts"] == 4 and out.info["start_spread_sd"] < 0.01

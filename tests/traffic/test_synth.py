"""The built-in article-004 mix: reproducible by seed, 40/40/20 with the article's ranges,
arrivals at the asked rate and burstiness."""
from __future__ import annotations

import numpy as np
import pytest

from tuner.core.errors import InputError
from tuner.traffic import article_mix, default_workload
from tuner.traffic.stats import dispersion
from tuner.traffic.synth import class_counts

# Article 004 section 4.1: (input chars lo, hi), (output tokens lo, hi) per class; output bands
# are disjoint, so a request's class can be read back from its output length.
BANDS = {"short": ((10, 200), (16, 200)), "medium": ((201, 800), (201, 500)), "long": ((801, 2000), (501, 1000))}


def classify(out: int) -> str:
    return next(k for k, (_, (lo, hi)) in BANDS.items() if lo <= out <= hi)


def test_reproducible_by_seed():
    assert article_mix(300, seed=3).fingerprint() == article_mix(300, seed=3).fingerprint()
    assert article_mix(300, seed=3).fingerprint() != article_mix(300, seed=4).fingerprint()
    assert article_mix(300, rate=2.0, seed=3).fingerprint() == article_mix(300, rate=2.0, seed=3).fingerprint()


@pytest.mark.parametrize("n", [1000, 7, 1])
def test_mix_proportions_and_ranges_hold(n):
    w = article_mix(n, seed=11)
    classes = [classify(int(o)) for o in w.output_tokens]
    counts = {k: classes.count(k) for k in BANDS}
    assert sum(counts.values()) == n
    for k, share in (("short", 0.4), ("medium", 0.4), ("long", 0.2)):
        assert abs(counts[k] - share * n) < 1  # exact up to rounding
    cpt = 1.4
    for cls, p in zip(classes, w.prompt_tokens):
        (c_lo, c_hi), _ = BANDS[cls]
        assert c_lo / cpt <= p <= c_hi / cpt + 1  # tokens of c_lo..c_hi Chinese characters
    assert w.estimated_tokens and np.all(w.arrival_s == 0)


def test_ranges_are_used_not_just_respected():
    w = article_mix(3000, seed=1)
    long = w.output_tokens[w.output_tokens > 500]
    assert long.min() < 520 and long.max() > 980  # uniform over 501..1000 reaches both ends


def test_chars_per_token_and_template_overhead():
    base = article_mix(200, seed=5)
    assert np.array_equal(article_mix(200, seed=5, template_tokens=30).prompt_tokens, base.prompt_tokens + 30)
    fewer = article_mix(200, seed=5, chars_per_token=2.0).prompt_tokens
    assert np.all(fewer <= base.prompt_tokens) and fewer.sum() < base.prompt_tokens.sum()


def test_arrivals_rate_and_burstiness():
    poisson = article_mix(6000, rate=20.0, seed=2)
    assert len(poisson) / poisson.span_s == pytest.approx(20.0, rel=0.05)
    assert 0.85 < dispersion(poisson.arrival_s) < 1.2
    bursty = article_mix(6000, rate=20.0, burstiness=0.25, seed=2)
    assert dispersion(bursty.arrival_s) > 2.0
    assert len(bursty) / bursty.span_s == pytest.approx(20.0, rel=0.15)


def test_default_workload_is_the_closed_loop_mix():
    assert default_workload().fingerprint() == article_mix(1000, seed=0).fingerprint()
    assert len(default_workload(n=64, seed=9)) == 64


def test_bad_arguments():
    for kwargs in ({"n": 0}, {"n": 10, "chars_per_token": 0}, {"n": 10, "rate": -1.0}, {"n": 10, "template_tokens": -2}):  # noqa: E501
        with pytest.raises(InputError):
            article_mix(**kwargs)
    assert class_counts(7, (0.4, 0.4, 0.2)) in ([3, 3, 1], [3, 2, 2], [2, 3, 2])

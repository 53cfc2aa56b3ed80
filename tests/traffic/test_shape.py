"""Shaping invariants: windows and samples are subsets in order, the multiplier scales
the span, truncation counts what it cuts, shared hash ids become shared token ids."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from tuner.core.errors import InputError
from tuner.traffic import article_mix, prompt_token_ids
from tuner.traffic.shape import closed_loop_order, sample, scale_rate, truncate, window
from tuner.traffic.stats import prefix_reuse
from tuner.traffic.workload import Request, Workload


def rows(w: Workload) -> Counter:
    return Counter((int(p), int(o)) for p, o in zip(w.prompt_tokens, w.output_tokens))


@pytest.fixture
def open_loop() -> Workload:
    return article_mix(2000, rate=10.0, seed=7)


def test_multiplier_scales_span_only(open_loop):
    fast = scale_rate(open_loop, 4.0)
    assert fast.span_s == pytest.approx(open_loop.span_s / 4)
    assert np.array_equal(fast.prompt_tokens, open_loop.prompt_tokens)
    with pytest.raises(InputError):
        scale_rate(open_loop, 0)


def test_window_keeps_exactly_the_requests_inside(open_loop):
    t = open_loop.arrival_s
    w = window(open_loop, 30.0, 60.0)
    inside = (t >= 30) & (t < 60)
    assert len(w) == inside.sum() and w.arrival_s[0] == 0.0
    assert w.span_s <= 30.0
    assert rows(w) == rows(open_loop.take(np.flatnonzero(inside)))
    with pytest.raises(InputError, match="no requests in the window"):
        window(open_loop, 1e6, 2e6)


def test_sample_is_a_seeded_subset_in_order(open_loop):
    s = sample(open_loop, 100, seed=1)
    assert len(s) == 100 and np.all(np.diff(s.arrival_s) >= 0)
    assert not rows(s) - rows(open_loop)
    assert s.fingerprint() == sample(open_loop, 100, seed=1).fingerprint()
    assert s.fingerprint() != sample(open_loop, 100, seed=2).fingerprint()
    assert len(sample(open_loop, fraction=0.25)) == 500


def test_sample_by_session_keeps_whole_conversations():
    reqs = [Request(float(i), 10 + i, 5, session=f"s{i % 13}", turn=i // 13) for i in range(130)]
    w = Workload.from_requests(reqs)
    s = sample(w, 30, seed=3)
    per = Counter(s.session)
    assert all(n == 10 for n in per.values()) and len(s) == 30


def test_closed_loop_order_groups_sessions_in_turn_order():
    reqs = [Request(0.0, 1, 1, "a", 0), Request(1.0, 2, 1, "b", 0), Request(2.0, 3, 1, None),
            Request(3.0, 4, 1, "a", 1), Request(4.0, 5, 1, "b", 1)]
    c = closed_loop_order(Workload.from_requests(reqs))
    assert list(c.session) == ["a", "a", "b", "b", None]
    assert c.prompt_tokens.tolist() == [1, 4, 2, 5, 3]
    assert np.all(c.arrival_s == 0)


def test_truncate_counts_and_fits():
    w = Workload.from_requests([
        Request(0.0, 3000, 200, hash_ids=tuple(range(6))),   # 3200 > 2048: cut
        Request(1.0, 1000, 100, hash_ids=(0, 1)),            # fits
        Request(2.0, 10, 5000),                              # output alone too long: cut
    ], block_tokens=512)
    cut_w, cut = truncate(w, 2048)
    assert cut == 2
    assert np.all(cut_w.prompt_tokens + cut_w.output_tokens <= 2048)
    assert cut_w.output_tokens.tolist() == [200, 100, 2047]  # outputs kept where they fit
    assert cut_w.prompt_tokens.tolist() == [1848, 1000, 1]
    assert len(cut_w.hash_ids[0]) == 4  # ceil(1848 / 512)
    dropped, n = truncate(w, 2048, drop=True)
    assert n == 2 and len(dropped) == 1
    same, zero = truncate(w, 10**6)
    assert zero == 0 and same is w


def mooncake_like() -> Workload:
    return Workload.from_requests([
        Request(0.0, 1100, 5, hash_ids=(0, 1, 2)),
        Request(1.0, 600, 5, hash_ids=(0, 3)),
        Request(2.0, 700, 5, hash_ids=(0, 1)),
        Request(3.0, 40, 5),
        Request(4.0, 40, 5),
    ], block_tokens=512)


def test_prompt_token_ids_share_exactly_the_shared_blocks():
    w = mooncake_like()
    ids = [prompt_token_ids(w, i, vocab_size=32000) for i in range(len(w))]
    assert [len(x) for x in ids] == w.prompt_tokens.tolist()
    a, b, c, d, e = ids
    assert a[:512] == b[:512]           # hash id 0 shared
    assert a[512:600] != b[512:600]     # ids 1 vs 3 differ
    assert c == a[:700]                 # ids (0, 1): all 700 tokens are a's first 700
    assert d[:16] != e[:16]             # no prefix structure: nothing shared
    assert prompt_token_ids(w, 1, vocab_size=32000) == b  # deterministic
    assert all(100 <= t < 32000 for t in prompt_token_ids(w, 0, vocab_size=32000, low=100))
    assert prompt_token_ids(w, 0, vocab_size=32000, seed=1)[:512] != a[:512]


def test_prompt_token_ids_realise_the_traces_prefix_reuse():
    """Counting distinct 512-token blocks of the generated ids reproduces the ideal hit ratio."""
    w = mooncake_like()
    w = w.take([0, 1, 2])
    seen, hits, total = set(), 0, 0
    for i in range(len(w)):
        toks = prompt_token_ids(w, i, vocab_size=50000)
        for j in range(0, len(toks), 512):
            block = tuple(toks[: j + 512])  # a block is identified by its whole prefix
            total += 1
            hits += block in seen
            seen.add(block)
    # request 2's second block is a partial block of a's second block, not the same 512 tokens
    assert hits == 2 and total == 7
    assert prefix_reuse(w) == pytest.approx(3 / 7)  # by hash id: 0 twice, 1 once again


def test_shaping_never_changes_the_input(open_loop):
    before = open_loop.fingerprint()
    scale_rate(open_loop, 2.0), window(open_loop, 0, 10), sample(open_loop, 10), truncate(open_loop, 100)
    closed_loop_order(replace(open_loop))
    assert open_loop.fingerprint() == before

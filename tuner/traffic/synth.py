"""The built-in workload: the request mix of article 004 (a Chinese write-up of an
eight-V100 deployment, section 4.1, a V100 vLLM load test drawn from the business's historical logs):

=========  =====  ======================  ======================
class      share  input (Chinese chars)   output (tokens)
=========  =====  ======================  ======================
short      40 %   10 - 200                16 - 200
medium     40 %   201 - 800               201 - 500
long       20 %   801 - 2000              501 - 1000
=========  =====  ======================  ======================

The article gives only the upper bounds ("输入200字符以内, 输出200 token以内", ...) and
names the classes short/short, medium/medium, long/long, so the bands are read as
disjoint: each class starts where the previous one ends. Within a band, lengths are
uniform (the article draws "randomly by proportion" and says nothing finer). The short
band starts at 10 characters and 16 tokens, about the article's own probe prompt
("请简单介绍一下深度学习的发展历史。", 17 characters). The class counts are exact
(40/40/20 of ``n``, rounded), in a seeded random order.

Characters become tokens at ``chars_per_token`` = 1.4 Chinese characters per token, the
middle of 1.37-1.5 measured for large-vocabulary Chinese-aware tokenizers such as
Qwen's (see :mod:`tuner.traffic._text` for the source). ``template_tokens`` adds chat
framing; the default is 0 because the article's load script posts raw prompts to
``/v1/completions`` (section 4.2), which applies no chat template (use ~30 for a
Qwen2.5 chat request with its default system prompt).

Arrivals: ``rate=None`` puts every request at t=0 (closed loop: N users send in order);
otherwise gamma inter-arrivals of mean ``1/rate`` with shape ``burstiness`` (1.0 is
Poisson, lower is burstier), as :class:`tuner.serving.load.Poisson` defines them.
"""
from __future__ import annotations

import math

import numpy as np

from tuner.core.errors import InputError
from tuner.serving.load import Poisson, arrival_times
from tuner.traffic._text import CJK_CHARS_PER_TOKEN
from tuner.traffic.workload import Workload

# (name, share, input chars lo..hi, output tokens lo..hi), article 004 section 4.1
ARTICLE_MIX: tuple[tuple[str, float, int, int, int, int], ...] = (
    ("short", 0.4, 10, 200, 16, 200),
    ("medium", 0.4, 201, 800, 201, 500),
    ("long", 0.2, 801, 2000, 501, 1000),
)


def class_counts(n: int, shares: tuple[float, ...]) -> list[int]:
    """Exact counts per class summing to ``n`` (largest remainders)."""
    raw = [n * s for s in shares]
    counts = [math.floor(x) for x in raw]
    for k in sorted(range(len(raw)), key=lambda k: raw[k] - counts[k], reverse=True)[: n - sum(counts)]:
        counts[k] += 1
    return counts


def article_mix(
    n: int = 1000,
    *,
    rate: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
    chars_per_token: float = CJK_CHARS_PER_TOKEN,
    template_tokens: int = 0,
) -> Workload:
    """``n`` requests of article 004's 40/40/20 short/medium/long mix (see module docs),
    reproducible from ``seed``. Token counts are estimates (``estimated_tokens``)."""
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"number of requests must be a positive integer, got {n!r}")
    if not chars_per_token > 0:
        raise InputError(f"chars_per_token must be > 0, got {chars_per_token}")
    if template_tokens < 0:
        raise InputError(f"template_tokens must be >= 0, got {template_tokens}")
    rng = np.random.default_rng(seed)
    counts = class_counts(int(n), tuple(m[1] for m in ARTICLE_MIX))
    klass = rng.permutation(np.repeat(np.arange(len(ARTICLE_MIX)), counts))
    chars = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for k, (_, _, c_lo, c_hi, o_lo, o_hi) in enumerate(ARTICLE_MIX):
        idx = np.flatnonzero(klass == k)
        chars[idx] = rng.integers(c_lo, c_hi + 1, size=len(idx))
        out[idx] = rng.integers(o_lo, o_hi + 1, size=len(idx))
    prompt = np.ceil(chars / chars_per_token).astype(np.int64) + int(template_tokens)
    if rate is None:
        arrivals = np.zeros(n)
        how = "all at t=0 (closed loop)"
    else:
        arrivals = arrival_times(Poisson(rate, burstiness, seed), np.zeros(n))
        how = f"{rate:g} req/s, burstiness {burstiness:g}"
    return Workload(
        arrival_s=arrivals,
        prompt_tokens=prompt,
        output_tokens=out,
        source=f"article-004-mix(n={n}, seed={seed})",
        estimated_tokens=True,
        notes=(
            f"synthetic: article 004 mix 40/40/20 short/medium/long, {how}, "
            f"{chars_per_token:g} Chinese characters per token",
        ),
    )


def default_workload(seed: int = 0, n: int = 1000) -> Workload:
    """The workload used when no trace is given: :func:`article_mix` at t=0."""
    return article_mix(n, seed=seed)

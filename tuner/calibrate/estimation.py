"""Fitting constants to measurements, and saying how well the measurements determine them.

:func:`fit_map` is bounded least squares (``scipy.optimize.least_squares``) of a model's
residuals, each divided by its measurement noise, plus one *prior* residual per constant,
``(x - prior) / prior_sd``: the maximum a posteriori estimate under Gaussian noise and
Gaussian priors. The prior rows make the problem well posed where the data cannot tell
two constants apart (two constants that trade off against each other, or one that no
measurement is sensitive to): along those directions the estimate stays at the prior
instead of wandering to wherever an unconverged or perturbed optimiser stops, so a
re-fit on another machine, or with another numpy, lands in the same place.

Each constant comes back as an :class:`Estimate` with its posterior standard deviation
from the Laplace approximation, ``cov = (J_dᵀJ_d / c + diag(1/prior_sd²))⁻¹``, where
``J_d`` is the Jacobian of the noise-scaled data residuals at the optimum and
``c = max(1, χ²/(m - n))`` widens the intervals when the residuals are larger than the
stated noise (model error). A constant is *determined by the data* when its posterior
sd is under half its prior sd; otherwise its value is the prior's, and the profile says so.

The optimiser runs to convergence (scipy's default tolerances) from each start given;
the starts' results are kept in ``info`` so a caller can see whether they agree.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: A constant is "determined by the data" when its posterior sd is below this share of its prior sd.
DETERMINED_SHARE = 0.5
#: Posterior correlations at least this strong are reported in ``info["correlated"]``.
STRONG_CORRELATION = 0.8
#: Two-sided 95 % normal quantile.
Z95 = 1.959963984540054
#: Convergence: the step changes every constant by under 0.01 % of its size, or the cost by
#: under 1e-6 of itself. The 95 % intervals are several % wide, so going on (scipy's
#: default 1e-8) only spends simulations on digits no interval can tell apart.
XTOL = 1e-4
FTOL = 1e-6


@dataclass(frozen=True, slots=True)
class Param:
    """One fitted constant, in the optimiser's units (``value = x * scale``)."""

    name: str
    scale: float
    low: float
    high: float
    prior: float
    prior_sd: float

    def __post_init__(self) -> None:
        if not self.low <= self.prior <= self.high:
            raise ValueError(f"{self.name}: prior {self.prior} outside [{self.low}, {self.high}]")
        if not self.prior_sd > 0:
            raise ValueError(f"{self.name}: prior_sd must be > 0")


@dataclass(frozen=True, slots=True)
class Estimate:
    """A fitted constant in its own units: value, posterior sd and 95 % interval (clipped
    to the bounds), the prior it started from, and whether the data determined it."""

    name: str
    value: float
    sd: float
    low95: float
    high95: float
    prior: float
    prior_sd: float
    determined: bool
    at_bound: bool

    def contains(self, value: float) -> bool:
        return self.low95 <= value <= self.high95

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "sd": self.sd, "ci95": [self.low95, self.high95], "prior": self.prior,
                "prior_sd": self.prior_sd, "determined": "data" if self.determined else "prior",
                "at_bound": self.at_bound}


@dataclass(frozen=True, slots=True)
class FitOutcome:
    x: np.ndarray                       # optimiser units
    estimates: tuple[Estimate, ...]
    info: dict[str, Any]

    def estimate(self, name: str) -> Estimate:
        return next(e for e in self.estimates if e.name == name)


def fit_map(
    residuals: Callable[[np.ndarray], np.ndarray],
    params: Sequence[Param],
    *,
    starts: Sequence[np.ndarray] | None = None,
    diff_step: float | None = None,
    max_nfev: int | None = None,
) -> FitOutcome:
    """MAP estimate of ``params`` (module docstring). ``residuals(x)`` returns the data
    residuals already divided by their noise (x in optimiser units). ``starts`` default
    to the priors; the lowest-cost converged start wins."""
    from scipy.optimize import least_squares

    lo = np.array([p.low for p in params], dtype=float)
    hi = np.array([p.high for p in params], dtype=float)
    mu = np.array([p.prior for p in params], dtype=float)
    sd = np.array([p.prior_sd for p in params], dtype=float)
    n = len(params)
    m_data = [0]

    def full(x: np.ndarray) -> np.ndarray:
        r = np.asarray(residuals(x), dtype=float)
        m_data[0] = len(r)
        return np.concatenate([r, (x - mu) / sd])

    runs = []
    for x0 in starts if starts is not None else [mu]:
        x0 = np.clip(np.asarray(x0, dtype=float), lo, hi)
        sol = least_squares(full, x0, bounds=(lo, hi), diff_step=diff_step, x_scale="jac", max_nfev=max_nfev,
                            xtol=XTOL, ftol=FTOL)
        runs.append(sol)
    best = min(runs, key=lambda s: s.cost)
    m = m_data[0]
    jd = best.jac[:m]
    rd = best.fun[:m]
    chi2 = float(rd @ rd)
    dof = max(m - n, 1)
    inflate = max(1.0, chi2 / dof)
    precision = jd.T @ jd / inflate + np.diag(1.0 / sd**2)
    cov = np.linalg.inv(precision)
    post = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    estimates = []
    for p, x, s in zip(params, best.x, post):
        span = max(p.high - p.low, 1e-300)
        at_bound = bool(min(x - p.low, p.high - x) < 1e-6 * span)
        estimates.append(Estimate(
            name=p.name, value=float(x * p.scale), sd=float(s * p.scale),
            low95=float(max(x - Z95 * s, p.low) * p.scale), high95=float(min(x + Z95 * s, p.high) * p.scale),
            prior=float(p.prior * p.scale), prior_sd=float(p.prior_sd * p.scale),
            determined=bool(s < DETERMINED_SHARE * p.prior_sd), at_bound=at_bound))
    corr = cov / np.outer(np.maximum(post, 1e-300), np.maximum(post, 1e-300))
    pairs = [(params[i].name, params[j].name, round(float(corr[i, j]), 3))
             for i in range(n) for j in range(i + 1, n) if abs(corr[i, j]) >= STRONG_CORRELATION]
    info = {
        "cost": float(best.cost), "chi2": chi2, "points": m, "dof": dof, "reduced_chi2": chi2 / dof,
        "interval_inflation": inflate, "status": int(best.status), "message": str(best.message),
        "evaluations": int(sum(s.nfev for s in runs)), "starts": len(runs),
        "start_costs": [float(s.cost) for s in runs],
        # how far the other starts ended from the best, in posterior sds (small: one optimum)
        # constants the data can only tell apart as a combination (e.g. a bandwidth and an
        # overhead that both lengthen a decode step): each one's interval is wide, their sum's is not
        "correlated": pairs,
        "start_spread_sd": float(max((np.max(np.abs(s.x - best.x) / np.maximum(post, 1e-300)) for s in runs),
                                     default=0.0)),
    }
    return FitOutcome(best.x, tuple(estimates), info)


def prior_starts(params: Sequence[Param], k: int, seed: int = 0) -> list[np.ndarray]:
    """The priors, then ``k - 1`` draws from them (clipped to the bounds): starts for
    :func:`fit_map` that probe whether the optimum found is the only one."""
    rng = np.random.default_rng(seed)
    mu = np.array([p.prior for p in params], dtype=float)
    sd = np.array([p.prior_sd for p in params], dtype=float)
    lo = np.array([p.low for p in params], dtype=float)
    hi = np.array([p.high for p in params], dtype=float)
    return [mu] + [np.clip(mu + sd * rng.standard_normal(len(mu)), lo, hi) for _ in range(max(0, k - 1))]


__all__ = ["Estimate", "FitOutcome", "Param", "fit_map", "prior_starts"]

"""Small distribution helpers (pure numpy, broadcasting): normal and gamma tails, lognormal strata,
and quantiles of mixtures by bisection. No scipy: kvscale's core needs numpy only."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvscale.perfmodel.queueing import normal_quantile

Array = NDArray[np.float64]
_BISECTION_ITERATIONS = 26  # 2^-26 of the bracket: far below any latency that matters


def normal_sf(z: ArrayLike) -> Array:
    """P(Z > z) for a standard normal (Abramowitz & Stegun 7.1.26 erfc, |error| < 1.5e-7)."""
    x = np.asarray(z, dtype=np.float64) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erfc_abs = poly * np.exp(-x * x)
    erfc: Array = np.where(x >= 0, erfc_abs, 2.0 - erfc_abs)
    return 0.5 * erfc


def gamma_sf(x: ArrayLike, mean: ArrayLike, variance: ArrayLike) -> Array:
    """P(X > x) for a gamma variable of the given mean and variance (Wilson-Hilferty cube-root normal
    approximation: within a few percent of the tail probability for shapes above ~0.3)."""
    mean_ = np.maximum(np.asarray(mean, dtype=np.float64), 1e-300)
    var = np.maximum(np.asarray(variance, dtype=np.float64), 1e-300)
    shape = np.maximum(mean_ * mean_ / var, 1e-3)
    ratio = np.maximum(np.asarray(x, dtype=np.float64), 0.0) / mean_
    spread = 1.0 / (9.0 * shape)
    z = (np.cbrt(ratio) - (1.0 - spread)) / np.sqrt(spread)
    return np.where(np.asarray(x) <= 0.0, 1.0, normal_sf(z))


# Stratum edges in probability: even through the body, ever finer through the tail, so that the
# percentiles an SLO names (p90 to p99.9) fall between strata rather than inside the last one.
_STRATA_EDGES = np.array([0.0, 0.15, 0.3, 0.45, 0.6, 0.7, 0.8, 0.87, 0.92, 0.95, 0.97, 0.98, 0.987, 0.992, 0.995,
                          0.997, 0.9985, 0.9993, 1.0])
# Output lengths: the shortest requests set the TPOT tail (a prompt chunk divided by few tokens), so
# both ends are refined.
BOTH_ENDS_EDGES = np.array([0.0, 0.001, 0.003, 0.006, 0.01, 0.017, 0.03, 0.05, 0.08, 0.13, 0.2, 0.3, 0.45, 0.6, 0.75,
                            0.87, 0.95, 0.99, 1.0])


def lognormal_strata(mean: float, quantile_value: float, quantile: float) -> tuple[Array, Array]:
    """(values, probabilities) of strata of a lognormal with the given mean whose `quantile` is
    `quantile_value`; one stratum at the mean when the quantile is the mean (lengths alike). The
    spread is capped where the quantile can no longer be matched (ratio exp(z²/2)); the values are
    rescaled so that their weighted mean is the mean exactly."""
    z = normal_quantile(quantile)
    ratio = max(quantile_value / max(mean, 1e-12), 1.0)
    if ratio <= 1.0 + 1e-9 or z <= 0.0:
        return np.array([mean]), np.array([1.0])
    disc = z * z - 2.0 * math.log(ratio)
    return _strata(mean, z - math.sqrt(max(disc, 0.0)))


def lognormal_strata_by_scv(mean: float, scv: float, edges: Array = _STRATA_EDGES) -> tuple[Array, Array]:
    """(values, probabilities) of strata of a lognormal with the given mean and squared coefficient
    of variation (variance / mean²)."""
    if scv <= 0.0:
        return np.array([mean]), np.array([1.0])
    sigma = math.sqrt(math.log1p(scv))
    return _strata(mean, sigma, edges)


def strata_midpoints(edges: Array = _STRATA_EDGES) -> tuple[Array, Array]:
    """(probability at each stratum's middle, each stratum's probability)."""
    return (edges[:-1] + edges[1:]) / 2.0, np.diff(edges)


def _strata(mean: float, sigma: float, edges: Array = _STRATA_EDGES) -> tuple[Array, Array]:
    mids, weights = strata_midpoints(edges)
    values = np.exp(sigma * np.array([normal_quantile(float(p)) for p in mids]))
    return values * (mean / float(np.dot(values, weights))), weights


def percentile_strata(points: tuple[tuple[float, float], ...], edges: Array = _STRATA_EDGES,
                      ) -> tuple[Array, Array]:
    """(values, probabilities) of strata of a distribution known by some of its quantiles
    ((probability, value) pairs): ln(value) interpolated linearly in the normal score between them
    (exact for a lognormal), and extended beyond the outermost ones along their segment (a single
    quantile: a point mass there)."""
    ordered = sorted(points)
    if len(ordered) == 1:
        return np.array([ordered[0][1]]), np.array([1.0])
    zs = np.array([normal_quantile(p) for p, _ in ordered])
    logs = np.log(np.maximum(np.array([v for _, v in ordered]), 1.0))
    mids, weights = strata_midpoints(edges)
    z = np.array([normal_quantile(float(p)) for p in mids])
    inside = np.interp(z, zs, logs)
    low_slope = (logs[1] - logs[0]) / max(zs[1] - zs[0], 1e-9)
    high_slope = (logs[-1] - logs[-2]) / max(zs[-1] - zs[-2], 1e-9)
    extended = np.where(z < zs[0], logs[0] + low_slope * (z - zs[0]),
                        np.where(z > zs[-1], logs[-1] + high_slope * (z - zs[-1]), inside))
    return np.maximum(np.exp(extended), 1.0), weights


def quantile_by_bisection(survival: Callable[[Array], Array], quantile: float, low: Array, high: Array) -> Array:
    """The smallest t in [low, high] with survival(t) <= 1 - quantile, elementwise, for a survival
    function that is non-increasing in t; `high` where even that is not enough."""
    target = 1.0 - quantile
    lo = np.asarray(low, dtype=np.float64).copy()
    hi = np.asarray(high, dtype=np.float64).copy()
    lo, hi = np.broadcast_arrays(lo, hi)
    lo, hi = lo.copy(), hi.copy()
    for _ in range(_BISECTION_ITERATIONS):
        mid = (lo + hi) / 2.0
        above = survival(mid) > target
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return hi

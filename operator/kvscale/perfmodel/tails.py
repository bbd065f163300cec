"""Tail of per-request TPOT under chunked prefill: short requests set the high percentiles.

A request's TPOT averages its inter-token steps; a step that also carries a prompt chunk is slower.
With a fraction `f` of steps carrying chunks, a request with n intervals sees K ~ Binomial(n, f) of
them, so its TPOT is decode + (chunk - decode) x K / n. A long request sees close to f; a request of
five tokens that shares one step with a prompt sees a fifth of a chunk step on every token. Over a
realistic spread of output lengths the SLO percentile is therefore set by the short requests, and
it rises with f much faster than a normal approximation at the mean length says.

Output lengths are taken as geometric with the workload's mean (the maximum-entropy guess when only
the mean is known; chat traces are close to it). Requests of one token have no inter-token time and
do not count, as in vLLM's histogram.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

_LENGTH_POINTS = 48  # representative output lengths (equal-probability strata of the distribution)
_FRACTION_GRID = np.linspace(0.0, 1.0, 129)
_MAX_INTERVALS = 4096  # beyond this a request's chunk share is its mean f to well under 1%


def _representative_intervals(mean_output_tokens: float) -> NDArray[np.int64]:
    """Inter-token intervals (length - 1) of requests of 2+ tokens at equal-probability strata of a
    geometric length distribution with the given mean."""
    p = 1.0 / max(mean_output_tokens, 1.0 + 1e-9)
    # Conditional on length >= 2, length - 1 is again geometric on 1, 2, ... with the same p.
    strata = (np.arange(_LENGTH_POINTS) + 0.5) / _LENGTH_POINTS
    if p >= 1.0:
        return np.ones(_LENGTH_POINTS, dtype=np.int64)
    intervals: NDArray[np.int64] = np.clip(np.ceil(np.log1p(-strata) / np.log1p(-p)), 1, _MAX_INTERVALS).astype(
        np.int64)
    return intervals


def _log_factorials(n: int) -> Array:
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])


@lru_cache(maxsize=256)
def _share_table(mean_output_key: float, quantile: float) -> Array:
    """The quantile of K/n over the length mixture, at each fraction of _FRACTION_GRID."""
    intervals = _representative_intervals(mean_output_key)
    logfact = _log_factorials(int(intervals.max()))
    ratios_parts = []
    logs_parts = []
    for n in intervals:
        k = np.arange(n + 1)
        ratios_parts.append(k / n)
        logs_parts.append(logfact[n] - logfact[k] - logfact[n - k])
    ratios = np.concatenate(ratios_parts)
    log_binom = np.concatenate(logs_parts)
    ks = np.concatenate([np.arange(n + 1) for n in intervals]).astype(np.float64)
    ns = np.concatenate([np.full(n + 1, n) for n in intervals]).astype(np.float64)
    order = np.argsort(ratios, kind="stable")
    ratios, log_binom, ks, ns = ratios[order], log_binom[order], ks[order], ns[order]
    table = np.empty_like(_FRACTION_GRID)
    for i, f in enumerate(_FRACTION_GRID):
        if f <= 0.0 or f >= 1.0:
            table[i] = f
            continue
        weights = np.exp(log_binom + ks * np.log(f) + (ns - ks) * np.log1p(-f)) / len(intervals)
        cumulative = np.cumsum(weights)
        table[i] = ratios[min(int(np.searchsorted(cumulative, quantile * cumulative[-1])), ratios.size - 1)]
    # Stochastic order in f makes the table non-decreasing; enforce it against rounding.
    return np.maximum.accumulate(table)


def chunk_share_quantile(fraction: Array, mean_output_tokens: float, quantile: float) -> Array:
    """The `quantile` of the share of a request's inter-token steps that carry a prompt chunk, when a
    fraction `fraction` of all steps do (0..1, array). Continuous and non-decreasing in `fraction`."""
    key = float(f"{max(mean_output_tokens, 1.0):.3g}")  # 3 significant digits: cached, smooth enough
    table = _share_table(key, round(float(quantile), 6))
    return np.interp(np.clip(fraction, 0.0, 1.0), _FRACTION_GRID, table)

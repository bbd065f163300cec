"""Percentiles from a Prometheus histogram's buckets, and whether the buckets resolve them.

`histogram_quantile()` interpolates linearly inside the bucket that holds the rank, from 0 in the
first bucket. A percentile that falls in the first bucket is therefore a fraction of that bucket's
bound whatever the real values are: vLLM's prefill-time buckets start at 0.3 s, so every prefill
shorter than that reads as 0.285 s at p95. Such a figure is only an upper bound and must not be fitted
to; this module says so instead of returning it as a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class BucketedPercentile:
    """A percentile read from cumulative buckets: Prometheus's interpolated `value`, and the bucket
    `(lower, upper]` that holds it (upper is inf for the +Inf bucket)."""

    value: float
    lower: float
    upper: float

    @property
    def resolved(self) -> bool:
        """False when the rank fell in the first bucket: all that is known is `value <= upper`."""
        return self.lower > 0.0 or not math.isfinite(self.upper)


def _complete(buckets: Iterable[tuple[float, float]]) -> list[tuple[float, float]] | None:
    """The `(upper bound, cumulative count or rate)` pairs by bound, NaN ones (a rate over nothing) left out;
    None unless they end in a +Inf bucket (a complete histogram) that counted something."""
    ordered = sorted((bound, count) for bound, count in buckets if not math.isnan(count))
    if not ordered or not math.isinf(ordered[-1][0]) or not ordered[-1][1] > 0.0:
        return None
    return ordered


def bucketed_percentile(quantile: float, buckets: Iterable[tuple[float, float]]) -> BucketedPercentile | None:
    """Prometheus's histogram_quantile over `(upper bound, cumulative count or rate)` pairs, with the
    bucket it came from; None when the histogram is empty (nothing observed in the window).

    As in Prometheus: linear inside the bucket holding the rank; the highest finite bound when the
    rank is in the +Inf bucket (a lower bound of the true value, which is still safe to alarm on).
    """
    ordered = _complete(buckets)
    if ordered is None:
        return None
    rank = quantile * ordered[-1][1]
    below, lower = 0.0, 0.0
    for index, (upper, cumulative) in enumerate(ordered):
        if cumulative >= rank:
            if math.isinf(upper):
                finite = ordered[index - 1][0] if index > 0 else 0.0
                return BucketedPercentile(value=finite, lower=finite, upper=upper)
            inside = cumulative - below
            share = (rank - below) / inside if inside > 0 else 1.0
            return BucketedPercentile(value=lower + (upper - lower) * share, lower=lower, upper=upper)
        below, lower = max(below, cumulative), upper
    return None


def share_within(bound: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The share of a histogram's observations at or below `bound`, from `(upper bound, cumulative count
    or rate)` pairs: the inverse of bucketed_percentile, linear inside the bucket that holds `bound` (from
    0 in the first). Beyond the highest finite bound, the share at that bound (a lower bound of the true
    one). None when the histogram is empty or has no +Inf bucket."""
    ordered = _complete(buckets)
    if ordered is None:
        return None
    total = ordered[-1][1]
    below, lower = 0.0, 0.0
    for upper, cumulative in ordered:
        if math.isinf(upper):
            return below / total
        if bound <= upper:
            inside = max(cumulative - below, 0.0)
            return (below + inside * (bound - lower) / (upper - lower)) / total if upper > lower else cumulative / total
        below, lower = max(below, cumulative), upper
    return below / total

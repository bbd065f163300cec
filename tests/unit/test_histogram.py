"""Percentiles from bucket rates, and when the buckets cannot resolve them (issue 18)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscale.autoscaler.histogram import bucketed_percentile

INF = math.inf
# vLLM's request_latency family (prefill time), cumulative rates of a window.
PREFILL_BOUNDS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0]


def _cumulative(counts: list[float], bounds: list[float]) -> list[tuple[float, float]]:
    total, out = 0.0, []
    for bound, count in zip([*bounds, INF], counts, strict=True):
        total += count
        out.append((bound, total))
    return out


def test_a_percentile_in_the_first_bucket_is_only_a_bound() -> None:
    # A real vLLM on CPU: every prefill took ~17 ms, all in the first bucket (<= 0.3 s).
    read = bucketed_percentile(0.95, _cumulative([5.0, 0, 0, 0, 0, 0, 0], PREFILL_BOUNDS))
    assert read is not None
    assert read.value == pytest.approx(0.285)  # what histogram_quantile reports: 0.95 x the bound
    assert not read.resolved and read.upper == 0.3


def test_a_percentile_past_the_first_bucket_is_resolved_within_its_bucket() -> None:
    read = bucketed_percentile(0.95, _cumulative([1.0, 1.0, 2.0, 0, 0, 0, 0], PREFILL_BOUNDS))
    assert read is not None and read.resolved
    assert (read.lower, read.upper) == (0.5, 0.8)
    assert read.value == pytest.approx(0.5 + 0.3 * (0.95 * 4 - 2) / 2)


def test_the_inf_bucket_answers_the_highest_finite_bound_as_a_lower_bound() -> None:
    read = bucketed_percentile(0.99, _cumulative([0, 0, 0, 0, 0, 1.0, 3.0], PREFILL_BOUNDS))
    assert read is not None and read.resolved and read.value == 2.0 and read.upper == INF


def test_an_empty_or_incomplete_histogram_has_no_percentile() -> None:
    assert bucketed_percentile(0.95, _cumulative([0] * 7, PREFILL_BOUNDS)) is None
    assert bucketed_percentile(0.95, [(0.3, 1.0), (0.5, 2.0)]) is None  # no +Inf bucket
    assert bucketed_percentile(0.95, [(0.3, math.nan), (INF, math.nan)]) is None  # rate over nothing
    assert bucketed_percentile(0.95, []) is None


@given(st.lists(st.floats(0, 100), min_size=7, max_size=7), st.floats(0.01, 0.99))
def test_the_percentile_lies_in_its_bucket(counts: list[float], quantile: float) -> None:
    read = bucketed_percentile(quantile, reversed(_cumulative(counts, PREFILL_BOUNDS)))  # any order
    if read is None:
        assert sum(counts) == 0
        return
    assert read.lower <= read.value <= read.upper
    assert read.resolved == (read.lower > 0 or read.upper == INF)

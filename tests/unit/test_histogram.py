"""Percentiles from bucket rates, and when the buckets cannot resolve them (issue 18)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvscale.autoscaler.histogram import bucketed_percentile, share_within
from kvscale.autoscaler.signals import Observation

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


# vLLM's time_to_first_token_seconds buckets around a 2-s SLO, cumulative requests of a window.
TTFT_BOUNDS = [0.5, 1.0, 2.5, 5.0]


def test_the_share_within_a_bound_interpolates_inside_its_bucket() -> None:
    buckets = _cumulative([50.0, 30.0, 15.0, 4.0, 1.0], TTFT_BOUNDS)
    assert share_within(1.0, buckets) == pytest.approx(0.8)  # a bucket's bound: exact
    # 2.0 s is 2/3 of the way through (1.0, 2.5]: 80 + 10 of the bucket's 15 requests
    assert share_within(2.0, buckets) == pytest.approx(0.9)
    assert share_within(0.25, buckets) == pytest.approx(0.25)  # from 0 in the first bucket
    assert share_within(60.0, buckets) == pytest.approx(0.99)  # past the last finite bound: what it holds
    assert share_within(1.0, []) is None and share_within(1.0, [(1.0, 3.0)]) is None  # empty, no +Inf
    assert share_within(1.0, _cumulative([0.0] * 5, TTFT_BOUNDS)) is None  # nothing finished


# Rates of requests per second: none, or at least a request a billion seconds (subnormal floats underflow).
@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-9, 100)), min_size=7, max_size=7), st.floats(0.01, 0.99))
def test_the_share_within_the_percentile_is_the_quantile(counts: list[float], quantile: float) -> None:
    buckets = _cumulative(counts, PREFILL_BOUNDS)
    read = bucketed_percentile(quantile, buckets)
    if read is None or read.upper == INF or read.upper == read.lower:
        return  # the +Inf bucket answers a bound, not a point the share can invert
    inside = dict(buckets)[read.upper] - (dict(buckets).get(read.lower, 0.0))
    if inside <= 0:
        return
    assert share_within(read.value, buckets) == pytest.approx(quantile, abs=1e-9)


def test_the_missed_share_adds_each_slos_misses_and_needs_both_histograms() -> None:
    ttft = _cumulative([50.0, 30.0, 15.0, 4.0, 1.0], TTFT_BOUNDS)  # 10% above 2 s
    tpot = _cumulative([97.0, 3.0], [0.05])  # 3% above 50 ms
    observation = Observation(sampled_at_s=0.0, pods_scraped=1, request_rate=1.0, mean_input_tokens=None,
                              mean_output_tokens=None, running_requests=0.0, waiting_requests=0.0,
                              kv_cache_usage=None, ttft_s=None, tpot_s=None, ttft_buckets=tuple(ttft),
                              tpot_buckets=tuple(tpot))
    assert observation.missed_slo_share(2.0, 0.05) == pytest.approx(0.13)
    # 25 ms is half the first TPOT bucket: half its 97 requests within
    assert observation.missed_slo_share(5.0, 0.025) == pytest.approx(0.01 + (1 - 0.97 * 0.5))
    # past the last finite bounds only the +Inf buckets' requests count as missed: a lower bound there
    assert observation.missed_slo_share(10.0, 1.0) == pytest.approx(0.01 + 0.03)
    assert observation.missed_slo_share(0.0, 0.0) == 1.0  # at most every request
    assert Observation(**{**observation.__dict__, "tpot_buckets": ()}).missed_slo_share(2.0, 0.05) is None

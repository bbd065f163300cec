"""Arrival-rate forecasters and their rolling backtest (kvscale.autoscaler.forecast)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvscale.autoscaler.forecast import BUCKET_S, SEASON_BUCKETS, Forecaster, ForecastState

T0 = 1_700_000_000.0 - (1_700_000_000.0 % 86_400)  # midnight, so bucket indices line up with the series
SAMPLE_S = 15.0


def _fed(rates: np.ndarray, horizon_s: float = 240.0, state: ForecastState | None = None) -> ForecastState:
    """One sample per 15 s decision; `rates` is per minute (each minute's four samples share it)."""
    state = (state or ForecastState()).with_horizon(horizon_s)
    for minute, rate in enumerate(rates):
        for k in range(4):
            state = state.observe(T0 + minute * BUCKET_S + k * SAMPLE_S, float(rate))
    return state


def _noisy(mean: np.ndarray, seed: int = 0) -> np.ndarray:
    """Per-minute rates with the Poisson noise of counting them over a minute."""
    rng = np.random.default_rng(seed)
    return rng.poisson(mean * BUCKET_S) / BUCKET_S


def test_last_value_until_enough_forecasts_were_scored() -> None:
    state = _fed(np.full(10, 4.0))
    forecast = state.forecast()
    assert forecast.forecaster is Forecaster.LAST_VALUE
    assert forecast.arrivals_per_s == pytest.approx(4.0)
    assert forecast.rise_per_s == pytest.approx(0.0)
    assert forecast.horizon_s == 240.0


def test_a_ramp_is_forecast_ahead_and_last_value_loses_the_backtest() -> None:
    minutes = np.arange(90)
    state = _fed(_noisy(2.0 + 0.1 * minutes))  # +0.1 req/s per minute
    truth = 2.0 + 0.1 * (89 + state.forecast().horizon_s / BUCKET_S)
    holt = state.forecast(Forecaster.HOLT_WINTERS)
    assert holt.arrivals_per_s == pytest.approx(truth, rel=0.1)
    assert holt.rise_per_s > 0.2  # four minutes of a 0.1/min rise, damped
    backtest = state.backtest()
    assert backtest[Forecaster.HOLT_WINTERS] < backtest[Forecaster.LAST_VALUE]  # type: ignore[operator]
    # the last value is always a horizon behind a ramp: the backtest chooses another (Holt-Winters or the
    # envelope, which on a ramp holds its latest and noisiest highs)
    assert state.forecast().forecaster is not Forecaster.LAST_VALUE, backtest


def test_a_steady_load_adds_no_rise() -> None:
    state = _fed(_noisy(np.full(120, 5.0), seed=1))
    forecast = state.forecast()
    assert abs(forecast.rise_per_s) < 0.5, forecast
    assert forecast.backtest_error_pct is not None and forecast.backtest_error_pct < 15


def test_recurring_bursts_are_held_by_the_envelope_where_pinned_and_auto_takes_the_closest_forecast() -> None:
    # Two busy minutes in every six (a rush at every batch job): shorter than a start-up, so the replicas
    # for it must be there when it comes. The envelope, pinned, holds the burst level. Auto scores by the
    # absolute error (the median's pinball loss): the envelope overshoots two minutes in three and last-value
    # is a burst late every time, so Holt-Winters' smoothed level wins; the policy's own burst terms hold the
    # burst's replicas (kvscale.autoscaler.policy, ScalingHistory.recent_burst), not the forecast.
    minutes = np.arange(180)
    rates = np.where(minutes % 6 < 2, 12.0, 3.0)
    state = _fed(rates)
    assert state.forecast(Forecaster.BURST_ENVELOPE).arrivals_per_s == pytest.approx(12.0)
    backtest = state.backtest()
    assert state.forecast().forecaster is Forecaster.HOLT_WINTERS, backtest
    holt = backtest[Forecaster.HOLT_WINTERS]
    assert holt is not None and all(holt < (error or 0.0) for f, error in backtest.items()
                                    if f is not Forecaster.HOLT_WINTERS)
    assert 3.0 < state.forecast().arrivals_per_s < 12.0


def test_a_daily_season_is_learned_after_one_day_and_forecasts_the_morning_ramp() -> None:
    minutes = np.arange(2 * SEASON_BUCKETS + 7 * 60)  # two days and the night of the third, to 07:00
    day_shape = 4.0 + 3.0 * np.sin(2 * math.pi * (minutes / SEASON_BUCKETS - 0.25 - 0.1))  # low at ~02:24
    state = _fed(day_shape, horizon_s=600.0)
    assert state.holt_winters.season, "a full day was seen: the season exists"
    forecast = state.forecast(Forecaster.HOLT_WINTERS)
    ahead = len(minutes) - 1 + forecast.horizon_s / BUCKET_S
    truth = 4.0 + 3.0 * math.sin(2 * math.pi * (ahead / SEASON_BUCKETS - 0.35))
    assert forecast.arrivals_per_s == pytest.approx(truth, rel=0.05)
    assert forecast.rise_per_s > 0  # morning: rising


def test_the_same_history_gives_the_same_forecast_after_a_restart() -> None:
    # A restarted operator reads the history back (Prometheus range queries) into a fresh state through
    # the same observe(): it must forecast as the one that stopped.
    rates = _noisy(2.0 + 0.05 * np.arange(60), seed=3)
    running = _fed(rates)
    restarted = ForecastState().with_horizon(240.0)
    for minute, rate in enumerate(rates):  # one point per minute, as a range query at a 60 s step gives
        restarted = restarted.observe(T0 + minute * BUCKET_S, float(rate))
    assert restarted.forecast().arrivals_per_s == pytest.approx(running.forecast().arrivals_per_s)
    assert restarted.forecast().forecaster == running.forecast().forecaster


def test_gaps_are_filled_and_late_samples_ignored() -> None:
    state = ForecastState().observe(T0, 2.0).observe(T0 + 10 * BUCKET_S, 3.0)
    assert state.holt_winters.buckets_seen == 10  # nine empty minutes carried the last rate
    assert state.observe(T0 + 5 * BUCKET_S, 100.0) == state  # older than the open bucket


def test_a_few_minutes_of_a_ramp_give_its_trend_as_after_a_restart_half_way_up() -> None:
    # An operator restarted half-way up a ramp is seeded with the few minutes Prometheus kept: Holt's
    # trend must start at the ramp's slope, not at zero (it would then take some ten minutes to see it).
    slope_per_min = 1.4
    state = _fed(1.0 + slope_per_min * np.arange(4), horizon_s=120.0)  # three closed minutes, one open
    forecast = state.forecast(Forecaster.HOLT_WINTERS)
    assert forecast.rise_per_s == pytest.approx(2 * slope_per_min, rel=0.05)
    flat = _fed(np.full(4, 3.0), horizon_s=120.0).forecast(Forecaster.HOLT_WINTERS)
    assert flat.rise_per_s == pytest.approx(0.0, abs=1e-9)

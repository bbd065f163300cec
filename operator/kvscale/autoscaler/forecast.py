"""Forecasts of a deployment's arrival rate over the horizon a scale-up needs, chosen by backtest.

Pure and incremental: `ForecastState.observe(t_s, arrivals)` folds one sample into one-minute
buckets; each closed bucket updates every forecaster (O(1) each) and scores the forecasts made one
horizon earlier for that bucket. `ForecastState.forecast(horizon_s)` answers with the forecaster
whose rolling backtest loss is lowest. History read back after a restart (a Prometheus range query)
goes through the same `observe`, so a restarted operator forecasts as the one that stopped did.

The forecasters:
- last-value: the last bucket's rate; what a purely reactive policy assumes.
- holt-winters: level and damped trend (Holt), plus an additive daily season once a full day of
  history exists (Winters); the ramps of a day and their repetition from one day to the next.
- burst-envelope: the highest bucket of the last few minutes; loads whose bursts recur faster than a
  replica starts are best served by holding their recent peak.

The loss is a pinball loss at PINBALL_QUANTILE, the median: the forecaster whose forecasts fall
closest to the load. Weighting under-forecasts more (a forecast below the load costs SLO violations
for a whole start-up) stacks a second margin on the policy's own (headroom, the scale-down tolerance,
the burst and breach terms), and on the benchmark's tuning cases it made Auto the dearest of the four
at matched attainment (docs/benchmarks.md, twenty-seventh session). The backtest error reported
(status.forecast) is the weighted absolute percentage error, sum |error| / sum load, over the same
rolling window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

BUCKET_S = 60.0
SEASON_S = 86_400.0  # one day
SEASON_BUCKETS = int(SEASON_S / BUCKET_S)
# Smoothing constants, a priori textbook values for minute data (not tuned on the benchmark's traces):
LEVEL_SMOOTHING = 0.3
TREND_SMOOTHING = 0.1
TREND_DAMPING = 0.99  # per bucket: a trend is believed for tens of minutes, not for hours
SEASON_SMOOTHING = 0.2
# Holt's start (the textbook one, not tuned): level and trend are the least-squares line through the
# first buckets, then the recursion. Started at a zero trend instead, TREND_SMOOTHING needs some ten
# buckets to see a ramp, and an operator restarted half-way up one (seeded with a few minutes of
# history) would size for a flat load while the ramp climbs.
TREND_START_BUCKETS = 4
BURST_ENVELOPE_BUCKETS = 10
# Chosen on the tuning cases of benchmarks/forecasters.py (0.5, 0.65, 0.8 tried: GPU-hours over the hindsight
# schedule at each run's own attainment, geometric mean 1.367x, 1.371x, 1.398x); not a textbook value.
PINBALL_QUANTILE = 0.5
# The rolling backtest forgets with this weight per scored bucket (a memory of about two hours).
BACKTEST_DECAY = 1.0 / 120.0
# Before this many scored buckets no backtest is trusted: last value (what the policy saw) is used.
MIN_SCORED_BUCKETS = 15
# Another forecaster takes over only when its loss is this much lower (no flapping between near-equals).
SWITCH_MARGIN = 0.1
# A pending forecast is kept only this long (enough for any start-up a deployment measures).
MAX_HORIZON_BUCKETS = 30


class Forecaster(StrEnum):
    LAST_VALUE = "last-value"
    HOLT_WINTERS = "holt-winters"
    BURST_ENVELOPE = "burst-envelope"


@dataclass(frozen=True)
class _HoltWinters:
    level: float | None = None
    trend: float = 0.0
    season: tuple[float, ...] = ()  # additive, one per bucket of the day; empty until a day is seen
    buckets_seen: int = 0
    first_day: tuple[float, ...] = ()  # the first day's buckets, to initialise the season from

    def update(self, value: float) -> _HoltWinters:
        index = self.buckets_seen % SEASON_BUCKETS
        if self.level is None:
            return replace(self, level=value, buckets_seen=1, first_day=(value,))
        seasonal = self.season[index] if self.season else 0.0
        level = LEVEL_SMOOTHING * (value - seasonal) + (1 - LEVEL_SMOOTHING) * (self.level + TREND_DAMPING * self.trend)
        trend = TREND_SMOOTHING * (level - self.level) + (1 - TREND_SMOOTHING) * TREND_DAMPING * self.trend
        season = self.season
        first_day = self.first_day
        if season:
            updated = SEASON_SMOOTHING * (value - level) + (1 - SEASON_SMOOTHING) * seasonal
            season = (*season[:index], updated, *season[index + 1:])
        elif len(first_day) < SEASON_BUCKETS:
            first_day = (*first_day, value)
            if len(first_day) == SEASON_BUCKETS:  # a whole day seen: its shape around its mean is the season
                mean = sum(first_day) / SEASON_BUCKETS
                season, first_day = tuple(v - mean for v in first_day), ()
        if not season and 0 < len(first_day) <= TREND_START_BUCKETS:
            level, trend = _least_squares_end(first_day)
        return _HoltWinters(level=level, trend=trend, season=season, buckets_seen=self.buckets_seen + 1,
                            first_day=first_day)

    def predict(self, ahead: int) -> float:
        if self.level is None:
            return 0.0
        damped = sum(TREND_DAMPING ** k for k in range(1, ahead + 1))  # 0 ahead: the smoothed present
        seasonal = self.season[(self.buckets_seen + ahead - 1) % SEASON_BUCKETS] if self.season else 0.0
        return max(0.0, self.level + damped * self.trend + seasonal)


def _least_squares_end(values: tuple[float, ...]) -> tuple[float, float]:
    """(value at the last point, slope per bucket) of the least-squares line through `values`."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    spread = sum((x - mean_x) ** 2 for x in range(n))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / spread if spread else 0.0
    return mean_y + slope * (n - 1 - mean_x), slope


@dataclass(frozen=True)
class _Score:
    pinball: float = 0.0  # exponentially weighted mean loss per bucket
    abs_error: float = 0.0  # exponentially weighted sums for the WAPE
    load: float = 0.0
    scored: int = 0

    def add(self, predicted: float, actual: float) -> _Score:
        error = actual - predicted
        loss = max(PINBALL_QUANTILE * error, (PINBALL_QUANTILE - 1) * error)
        keep = 1 - BACKTEST_DECAY
        return _Score(pinball=keep * self.pinball + BACKTEST_DECAY * loss,
                      abs_error=keep * self.abs_error + abs(error), load=keep * self.load + actual,
                      scored=self.scored + 1)

    @property
    def error_pct(self) -> float | None:
        return None if self.load <= 0 or self.scored == 0 else 100.0 * self.abs_error / self.load


@dataclass(frozen=True)
class Forecast:
    """Arrivals/s expected `horizon_s` from now, by `forecaster`, and how that forecaster has fared."""

    arrivals_per_s: float
    horizon_s: float
    # what the forecaster expects to be added to the load of now by then: the policy adds it to the
    # arrivals it sees (fresher than the last closed bucket, and than a smoothed level that trails a ramp)
    rise_per_s: float
    forecaster: Forecaster
    backtest_error_pct: float | None  # WAPE over the rolling backtest; None before any forecast was scored
    scored_buckets: int


@dataclass(frozen=True)
class ForecastState:
    """Every forecaster's state and its rolling backtest, for one deployment."""

    horizon_s: float = 180.0  # what the forecasts are scored at: the measured start-up plus one decision
    bucket_index: int | None = None  # the open bucket (epoch s // BUCKET_S)
    bucket_sum: float = 0.0
    bucket_samples: int = 0
    recent: tuple[float, ...] = ()  # closed bucket rates, newest last (the burst envelope's memory)
    day: tuple[float, ...] = ()  # the last day's closed bucket rates, newest last (what re-planning prices)
    holt_winters: _HoltWinters = field(default_factory=_HoltWinters)
    # (target bucket index, forecaster, predicted) made when earlier buckets closed, awaiting their target
    pending: tuple[tuple[int, Forecaster, float], ...] = ()
    scores: tuple[tuple[Forecaster, _Score], ...] = tuple((f, _Score()) for f in Forecaster)
    chosen: Forecaster = Forecaster.LAST_VALUE

    @property
    def recent_peak(self) -> float:
        """The highest bucket of the burst envelope's memory (0 before any bucket closed)."""
        return max(self.recent, default=0.0)

    def with_horizon(self, horizon_s: float) -> ForecastState:
        return replace(self, horizon_s=max(horizon_s, BUCKET_S))

    def observe(self, t_s: float, arrivals_per_s: float) -> ForecastState:
        """Fold one rate sample in (samples come every decision; older ones than the open bucket are
        ignored). Gaps longer than a bucket are filled with the last rate, so a season stays aligned."""
        index = int(t_s // BUCKET_S)
        state = self
        if state.bucket_index is None:
            return replace(state, bucket_index=index, bucket_sum=arrivals_per_s, bucket_samples=1)
        if index < state.bucket_index:
            return state
        if index == state.bucket_index:
            return replace(state, bucket_sum=state.bucket_sum + arrivals_per_s,
                           bucket_samples=state.bucket_samples + 1)
        closed = state.bucket_sum / max(state.bucket_samples, 1)
        start = state.bucket_index
        for k in range(min(index - start, SEASON_BUCKETS)):  # a day of silence at most is replayed
            state = state._close(start + k, closed)
        return replace(state, bucket_index=index, bucket_sum=arrivals_per_s, bucket_samples=1)

    def _close(self, index: int, value: float) -> ForecastState:
        """Score what was forecast for bucket `index`, update every forecaster with its value, and make
        each one's forecast for one horizon ahead."""
        scores = dict(self.scores)
        still = []
        for target, forecaster, predicted in self.pending:
            if target == index:
                scores[forecaster] = scores[forecaster].add(predicted, value)
            elif target > index:
                still.append((target, forecaster, predicted))
        recent = (*self.recent, value)[-max(BURST_ENVELOPE_BUCKETS, 1):]
        state = replace(self, bucket_index=index, recent=recent, holt_winters=self.holt_winters.update(value),
                        scores=tuple(scores.items()), day=(*self.day, value)[-SEASON_BUCKETS:])
        ahead = state._ahead()
        made = tuple((index + ahead, f, state._predict(f, ahead)) for f in Forecaster)
        return replace(state, pending=(*still, *made), chosen=state._choose())

    def _ahead(self) -> int:
        return min(max(1, math.ceil(self.horizon_s / BUCKET_S - 1e-9)), MAX_HORIZON_BUCKETS)

    def _predict(self, forecaster: Forecaster, ahead: int) -> float:
        if not self.recent:
            return 0.0
        if forecaster is Forecaster.LAST_VALUE:
            return self.recent[-1]
        if forecaster is Forecaster.BURST_ENVELOPE:
            return max(self.recent)
        return self.holt_winters.predict(ahead)

    def _choose(self) -> Forecaster:
        scores = dict(self.scores)
        if min(s.scored for s in scores.values()) < MIN_SCORED_BUCKETS:
            return Forecaster.LAST_VALUE
        best = min(scores, key=lambda f: scores[f].pinball)
        if scores[best].pinball < (1 - SWITCH_MARGIN) * scores[self.chosen].pinball:
            return best
        return self.chosen

    def forecast(self, pinned: Forecaster | None = None) -> Forecast:
        """The chosen (or pinned) forecaster's arrivals/s one horizon from the last closed bucket."""
        forecaster = pinned or self.chosen
        ahead = self._ahead()
        score = dict(self.scores)[forecaster]
        predicted = self._predict(forecaster, ahead)
        if forecaster is Forecaster.HOLT_WINTERS:
            now = self.holt_winters.predict(0)
        else:
            now = self.recent[-1] if self.recent else 0.0
        return Forecast(arrivals_per_s=predicted, horizon_s=ahead * BUCKET_S, rise_per_s=predicted - now,
                        forecaster=forecaster, backtest_error_pct=score.error_pct, scored_buckets=score.scored)

    def backtest(self) -> dict[Forecaster, float | None]:
        """Each forecaster's rolling WAPE (percent), for the comparison status and benchmarks print."""
        return {f: s.error_pct for f, s in self.scores}


def forecasts_from(points: Iterable[tuple[float, float]]) -> ForecastState:
    """A state that has seen `points` (epoch s, arrivals/s), oldest first: a restarted operator's,
    from the history Prometheus kept."""
    state = ForecastState()
    for t_s, arrivals in points:
        state = state.observe(t_s, arrivals)
    return state


__all__ = ["BUCKET_S", "Forecast", "ForecastState", "Forecaster", "forecasts_from"]

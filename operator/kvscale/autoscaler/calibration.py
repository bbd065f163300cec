"""Online calibration: fit the model to what the servers show, in speed and in tail shape.

Speed: the model predicts mean TPOT at the observed per-replica arrival rate (open loop, so prompt
load is what actually arrives) and mean prefill time for the observed prompts; the ratios to the
observed means rescale the model's achieved bandwidth (decode) and compute (prefill).
Tails: percentiles of real traffic are wider than the model's (lengths vary, arrivals cluster), so
the ratio of observed to predicted SLO-percentile TTFT and TPOT is learned as a tail factor, which
tightens the SLOs the goodput is computed against.
Windows whose arrivals came in bursts (beyond Poisson noise) teach only the request shape: their
prompts shared steps far more than the mean rate says, and fitting speed to them reads a burst as
slow hardware (the policy sizes for bursts separately).
Every factor is bounded (one odd sample never swings the model past the bounds) and smoothed in log
space (a step change is followed within a few cycles without chasing noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvscale.perfmodel import (
    EfficiencyFactors,
    RequestShape,
    ServingSetup,
    build_replica_model,
    estimate_at_observed_load,
    estimate_at_rate,
)

SPEED_BOUNDS = (0.25, 4.0)  # the model may be off by 4x either way, not more
TAIL_BOUNDS = (0.5, 4.0)
SMOOTHING = 0.3  # weight of the newest sample
# A window in which sequences ran at all times this long (on average) measured decode steps; even a
# light load's batch of one is a clean measurement of the step at that batch.
MIN_RUNNING_FOR_DECODE_FIT = 0.05
# Below this share of decode work in the mean inter-token time, TPOT measures prompt stalls (and how
# bursty arrivals bunch them), not decode speed: such windows leave the decode factor alone.
MIN_DECODE_SHARE_FOR_FIT = 0.5


@dataclass(frozen=True)
class CalibrationSample:
    """One observation window, per replica, with what the model needs to predict the same figures."""

    shape: RequestShape
    quantile: float
    running_per_replica: float
    rate_per_replica: float | None  # finished requests/s per replica
    slots: float  # concurrent sequences a replica runs (max-num-seqs or the KV cache)
    tpot_mean_s: float | None = None
    tpot_quantile_s: float | None = None
    ttft_quantile_s: float | None = None
    prefill_mean_s: float | None = None
    steady: bool = True  # no queue and no replica starting: only then do percentiles say something
    # about the servers rather than about a backlog (which the policy's queue term handles)
    bursty: bool = False  # arrivals clustered beyond Poisson noise: prompts shared the token budget
    # and steps far more than the window's mean rate says, so its means and percentiles measure the
    # burst (which the policy sizes for separately), not the servers' speed or tails


@dataclass(frozen=True)
class Calibration:
    """Speed factors (>1: faster than the defaults), tail factors (>1: wider tails than modelled) and
    the last prediction errors (before the update, in percent)."""

    decode_factor: float = 1.0
    prefill_factor: float = 1.0
    tpot_tail_factor: float = 1.0
    ttft_tail_factor: float = 1.0
    tpot_error_pct: float | None = None
    ttft_error_pct: float | None = None
    samples: int = 0
    # The request shape, smoothed over windows: one minute of unusually long prompts should not
    # halve the goodput estimate (and double the replicas) by itself.
    input_tokens: float | None = None
    output_tokens: float | None = None
    input_tokens_tail: float | None = None  # prompt length at the SLO percentile

    def shape(self, fallback: RequestShape) -> RequestShape:
        if self.input_tokens is None or self.output_tokens is None:
            return fallback
        tail = self.input_tokens_tail if self.input_tokens_tail is not None else fallback.input_tokens_tail
        return RequestShape(self.input_tokens, self.output_tokens, tail)

    def efficiency(self, base: EfficiencyFactors) -> EfficiencyFactors:
        return base.scaled(decode=self.decode_factor, prefill=self.prefill_factor)


def _bounded(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


def _smoothed(previous: float, target: float, first: bool, bounds: tuple[float, float]) -> float:
    if first and bounds is SPEED_BOUNDS:
        return _bounded(target, bounds)  # speed: trust the first sample; tails: always approach from 1
    log_value = (1 - SMOOTHING) * math.log(previous) + SMOOTHING * math.log(_bounded(target, bounds))
    return _bounded(math.exp(log_value), bounds)


def _smoothed_value(previous: float | None, sample: float) -> float:
    return sample if previous is None else (1 - SMOOTHING) * previous + SMOOTHING * sample


def calibrate(previous: Calibration, setup: ServingSetup, sample: CalibrationSample) -> Calibration:
    """One calibration step from one window; unchanged when the window holds nothing to learn from.
    A bursty window (CalibrationSample.bursty) updates only the request shape."""
    if sample.bursty:
        return _with_shape(previous, sample)
    first = previous.samples == 0
    model = build_replica_model(replace(setup, efficiency=previous.efficiency(setup.efficiency)))
    rate = sample.rate_per_replica if sample.rate_per_replica and sample.rate_per_replica > 0 else None

    # Both speeds are fitted at the observed batch and arrival rate (never a saturated model's batch):
    # prefill first, from a prompt's own prefill time; then decode from the mean inter-token time with
    # that prefill speed in place, so prompt chunks stalling decode steps are not read as slow decoding.
    running = sample.running_per_replica
    prefill, ttft_error = previous.prefill_factor, None
    if sample.prefill_mean_s:
        predicted_prefill = estimate_at_observed_load(model, sample.shape, running, rate or 0.0).prefill_s
        ttft_error = (predicted_prefill - sample.prefill_mean_s) / sample.prefill_mean_s * 100.0
        prefill = _smoothed(previous.prefill_factor,
                            previous.prefill_factor * predicted_prefill / sample.prefill_mean_s, first, SPEED_BOUNDS)
    decode, tpot_error = previous.decode_factor, None
    if sample.tpot_mean_s and running >= MIN_RUNNING_FOR_DECODE_FIT:
        with_prefill = build_replica_model(replace(setup, efficiency=replace(
            previous, prefill_factor=prefill).efficiency(setup.efficiency)))
        seen = estimate_at_observed_load(with_prefill, sample.shape, running, rate or 0.0)
        tpot_error = (seen.tpot_mean_s - sample.tpot_mean_s) / sample.tpot_mean_s * 100.0
        if seen.decode_share >= MIN_DECODE_SHARE_FOR_FIT:
            decode = _smoothed(previous.decode_factor,
                               previous.decode_factor * seen.tpot_mean_s / sample.tpot_mean_s, first, SPEED_BOUNDS)
    if tpot_error is None and ttft_error is None:
        return previous
    tpot_tail, ttft_tail = previous.tpot_tail_factor, previous.ttft_tail_factor
    if rate is not None and sample.steady and (sample.tpot_quantile_s or sample.ttft_quantile_s):
        speed = replace(previous, decode_factor=decode, prefill_factor=prefill)
        calibrated = build_replica_model(replace(setup, efficiency=speed.efficiency(setup.efficiency)))
        at = estimate_at_rate(calibrated, sample.shape, rate, sample.slots, sample.quantile)
        if sample.tpot_quantile_s and bool(at.stable) and float(at.tpot_quantile_s) > 0:
            tpot_tail = _smoothed(previous.tpot_tail_factor, sample.tpot_quantile_s / float(at.tpot_quantile_s),
                                  first, TAIL_BOUNDS)
        if sample.ttft_quantile_s and bool(at.stable) and float(at.ttft_quantile_s) > 0:
            ttft_tail = _smoothed(previous.ttft_tail_factor, sample.ttft_quantile_s / float(at.ttft_quantile_s),
                                  first, TAIL_BOUNDS)
    return _with_shape(replace(previous, decode_factor=decode, prefill_factor=prefill, tpot_tail_factor=tpot_tail,
                               ttft_tail_factor=ttft_tail, tpot_error_pct=tpot_error, ttft_error_pct=ttft_error,
                               samples=previous.samples + 1), sample)


def _with_shape(calibration: Calibration, sample: CalibrationSample) -> Calibration:
    """The smoothed request shape updated with the window's."""
    tail = calibration.input_tokens_tail
    if sample.shape.input_tokens_tail is not None:
        tail = _smoothed_value(calibration.input_tokens_tail, sample.shape.input_tokens_tail)
    return replace(calibration, input_tokens=_smoothed_value(calibration.input_tokens, sample.shape.input_tokens),
                   output_tokens=_smoothed_value(calibration.output_tokens, sample.shape.output_tokens),
                   input_tokens_tail=tail)

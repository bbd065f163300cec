"""Online calibration: fit the model to what the servers show, in speed and in tail shape.

Speed: the model predicts mean TPOT at the observed per-replica arrival rate (open loop, so prompt
load is what actually arrives) and mean prefill time for the observed prompts; the ratios to the
observed means rescale the model's achieved bandwidth (decode) and compute (prefill).
Tails: percentiles of real traffic are wider than the model's (lengths vary, arrivals cluster), so
the ratio of observed to predicted SLO-percentile TTFT and TPOT is learned as a tail factor, which
tightens the SLOs the goodput is computed against.
Where the engine counts its own work (vLLM's MFU counters, --enable-mfu-metrics), speed is fitted
from it instead: the bandwidth and FLOP/s a GPU achieved, against the datasheet peak times the default
efficiency (kvscale.autoscaler.engine_work); each factor the counters cannot tell in a window keeps
the latency fit, and without the counters the fit is exactly the latency one.
Windows whose arrivals came in bursts (beyond Poisson noise) teach only the request shape: their
prompts shared steps far more than the mean rate says, and fitting speed to them reads a burst as
slow hardware (the policy sizes for bursts separately); windows that breached an SLO under a load beyond
what the calibrated model says a replica holds teach only the shape too (the policy already scales up for
them, and an overload's latencies are where the model's form is furthest from the servers'). Windows in
which requests queued for a slot leave the prefill speed alone: each prompt's prefill time there shares
the token budget with a backlog's prompts, which the finished rate does not show.
A percentile teaches the tails in proportion to the requests the window held beyond it: a quiet
window's p99 over a handful of requests is about their maximum, far below the true percentile. The TTFT's,
which a few rare requests set, asks for ten times the evidence the TPOT's does.
Every factor is bounded (one odd sample never swings the model past the bounds) and smoothed in log
space (a step change is followed within a few cycles without chasing noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvscale.api.status import SpeedFitSource
from kvscale.autoscaler.engine_work import AchievedSpeeds, EngineWork, estimate_achieved_speeds
from kvscale.perfmodel import (
    EfficiencyFactors,
    ReplicaModel,
    RequestShape,
    ServingSetup,
    build_replica_model,
    estimate_at_observed_load,
    estimate_at_rate,
)

SPEED_BOUNDS = (0.25, 4.0)  # the model may be off by 4x either way, not more
TAIL_BOUNDS = (0.5, 4.0)
SMOOTHING = 0.3  # weight of the newest sample
# The request shape is a mean over requests, not over windows: each window's means weigh by the requests
# behind them. Until this many requests are seen it is their plain mean (the first window no more than
# any later one); from then on it forgets at that rate (a window of n new requests weighs n / (this + n)).
# A quiet window's handful of prompts (or none, where the spec's figure stands in) barely moves it; a
# busy one's hundreds do. Prompt lengths vary with a CV near 1, so a mean over this many is within ~3%.
# Tuned on the tuning cases of benchmarks/autoscaling.py (docs/benchmarks.md).
SHAPE_MEMORY_REQUESTS = 1000.0
# A window in which sequences ran at all times this long (on average) measured decode steps; even a
# light load's batch of one is a clean measurement of the step at that batch.
MIN_RUNNING_FOR_DECODE_FIT = 0.05
# Below this share of decode work in the mean inter-token time, TPOT measures prompt stalls (and how
# bursty arrivals bunch them), not decode speed: such windows leave the decode factor alone.
MIN_DECODE_SHARE_FOR_FIT = 0.5
# A window's percentile updates a tail factor with full weight (SMOOTHING) once the window holds this many
# requests beyond the percentile in expectation (100 requests for a p99), in proportion below that.
TAIL_EVIDENCE_REQUESTS = 1.0
# The TTFT's percentile asks for ten. A few rare requests set it (the longest prompts, meeting a wait), so one
# window's p99 over a hundred requests is about their largest TTFT; at full weight per hundred the TTFT tail
# factor swung between 0.91 and 1.41 on a recurring pattern and the goodput of a TTFT-bound replica with it,
# 0.38-2.04 req/s. A per-request TPOT averages many steps, and its percentile keeps the rule above. Chosen on
# the tuning cases of benchmarks/autoscaling.py (1, 3, 10, 30; docs/benchmarks.md).
TTFT_TAIL_EVIDENCE_REQUESTS = 10.0


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
    # requests waited for a slot (a queue on the replicas, or one drained in the window): prompts competed
    # with a backlog's for the token budget, so their prefill time measures the backlog, not the hardware
    queued: bool = False
    # An SLO breached at a per-replica rate beyond what the calibrated model itself says a replica holds the
    # SLOs at (policy.build_calibration_sample): the policy already sizes up for it, and the window measures
    # an overload (prompts waiting behind others for the token budget), where the model's form is furthest
    # from the servers. Fitted there, the prefill speed fell 0.67 -> 0.44 in a step from 3 to 9 req/s and the
    # fleet asked for 8 replicas where 4-5 held (docs/benchmarks.md). Such windows teach only the shape.
    overloaded: bool = False
    prefix_cache_hit_rate: float | None = None  # measured in this window (the shape holds the one assumed)
    engine_work: EngineWork | None = None  # the engine's own work counters, per GPU; None: not exported
    # Finished requests (all replicas) new since the previous sample, whose lengths the shape's means are
    # over; None: unknown, and the shape is smoothed per window (SMOOTHING).
    new_requests: float | None = None
    # Finished requests (all replicas) the window's percentiles are over; None: unknown (full weight).
    window_requests: float | None = None

    def tail_weight(self, evidence_requests: float = TAIL_EVIDENCE_REQUESTS) -> float:
        """The share of SMOOTHING this window's percentile carries: full from `evidence_requests` beyond it."""
        if self.window_requests is None:
            return 1.0
        beyond = self.window_requests * (1.0 - self.quantile)
        return min(max(beyond / evidence_requests, 0.0), 1.0)


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
    prefix_cache_hit_rate: float | None = None  # share of prompt tokens the prefix cache served
    shape_requests: float | None = None  # requests the shape is a mean over (SHAPE_MEMORY_REQUESTS at most)
    speed_fit_from: SpeedFitSource | None = None  # what the last speed update was fitted from
    # per GPU, measured from the engine's work counters and smoothed over the windows that measured them
    achieved_hbm_bandwidth_bytes_per_s: float | None = None
    achieved_flops_per_s: float | None = None

    def shape(self, fallback: RequestShape) -> RequestShape:
        if self.input_tokens is None or self.output_tokens is None:
            return fallback
        tail = self.input_tokens_tail if self.input_tokens_tail is not None else fallback.input_tokens_tail
        hit_rate = self.prefix_cache_hit_rate
        # The learned means and tail replace the fallback's; what is not learned (the stated length
        # percentiles, the percentile the tail is at) carries over from it.
        return replace(fallback.rescaled(self.input_tokens, self.output_tokens), input_tokens_tail=tail,
                       prefix_cache_hit_rate=fallback.prefix_cache_hit_rate if hit_rate is None else hit_rate)

    def efficiency(self, base: EfficiencyFactors) -> EfficiencyFactors:
        return base.scaled(decode=self.decode_factor, prefill=self.prefill_factor)


def _bounded(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


def _smoothed(previous: float, target: float, first: bool, bounds: tuple[float, float], weight: float = 1.0,
              ) -> float:
    """`previous` moved towards `target` by SMOOTHING (times `weight`, the sample's evidence) in log space."""
    if first and bounds is SPEED_BOUNDS:
        return _bounded(target, bounds)  # speed: trust the first sample; tails: always approach from 1
    step = SMOOTHING * weight
    log_value = (1 - step) * math.log(previous) + step * math.log(_bounded(target, bounds))
    return _bounded(math.exp(log_value), bounds)


def _weighted(previous: float | None, sample: float, weight: float) -> float:
    return sample if previous is None else (1.0 - weight) * previous + weight * sample


def _smoothed_if_measured(previous: float | None, sample: float | None) -> float | None:
    return previous if sample is None else _weighted(previous, sample, SMOOTHING)


def _achieved_speeds(model: ReplicaModel, sample: CalibrationSample, rate: float | None) -> AchievedSpeeds:
    """What the engine's work counters say the replica achieved; nothing without them, or without the
    mean step time and a batch that measured steps at all."""
    if sample.engine_work is None or not sample.tpot_mean_s or sample.running_per_replica < MIN_RUNNING_FOR_DECODE_FIT:
        return AchievedSpeeds(None, None)
    return estimate_achieved_speeds(model, sample.shape, sample.running_per_replica, rate or 0.0,
                                    sample.tpot_mean_s, sample.engine_work)


def _counter_factors(model: ReplicaModel, base: EfficiencyFactors, achieved: AchievedSpeeds,
                     ) -> tuple[float | None, float | None]:
    """(decode, prefill) factors the achieved speeds imply: achieved over the datasheet peak times the
    default efficiency, the same product the model divides work by (kvscale.perfmodel.replica)."""
    gpu = model.setup.gpu
    decode = (None if achieved.hbm_bandwidth_bytes_per_s is None
              else achieved.hbm_bandwidth_bytes_per_s
              / (gpu.hbm_bandwidth_bytes_per_s * base.hbm_bandwidth * gpu.weight_streaming_scale))
    prefill = (None if achieved.flops_per_s is None
               else achieved.flops_per_s / (model.linear_flops_per_s * base.compute))
    return decode, prefill


def calibrate(previous: Calibration, setup: ServingSetup, sample: CalibrationSample) -> Calibration:
    """One calibration step from one window; unchanged when the window holds nothing to learn from.
    A bursty or overloaded window (CalibrationSample.bursty, .overloaded) updates only the request shape."""
    if sample.bursty or sample.overloaded:
        return _with_shape(previous, sample)
    first = previous.samples == 0
    model = build_replica_model(replace(setup, efficiency=previous.efficiency(setup.efficiency)))
    rate = sample.rate_per_replica if sample.rate_per_replica and sample.rate_per_replica > 0 else None

    # Both speeds are fitted at the observed batch and arrival rate (never a saturated model's batch):
    # prefill first, from a prompt's own prefill time; then decode from the mean inter-token time with
    # that prefill speed in place, so prompt chunks stalling decode steps are not read as slow decoding.
    running = sample.running_per_replica
    # Where the engine counted its work, the factors come from what it achieved; each one the counters
    # cannot tell in this window is fitted from the latencies as below.
    achieved = _achieved_speeds(model, sample, rate)
    counter_decode, counter_prefill = _counter_factors(model, setup.efficiency, achieved)
    prefill, ttft_error = previous.prefill_factor, None
    if sample.prefill_mean_s:
        predicted_prefill = estimate_at_observed_load(model, sample.shape, running, rate or 0.0).prefill_s
        ttft_error = (predicted_prefill - sample.prefill_mean_s) / sample.prefill_mean_s * 100.0
        if counter_prefill is None and not sample.queued:
            prefill = _smoothed(previous.prefill_factor, previous.prefill_factor * predicted_prefill
                                / sample.prefill_mean_s, first, SPEED_BOUNDS)
    if counter_prefill is not None:
        prefill = _smoothed(previous.prefill_factor, counter_prefill, first, SPEED_BOUNDS)
    decode, tpot_error = previous.decode_factor, None
    if sample.tpot_mean_s and running >= MIN_RUNNING_FOR_DECODE_FIT:
        with_prefill = build_replica_model(replace(setup, efficiency=replace(
            previous, prefill_factor=prefill).efficiency(setup.efficiency)))
        seen = estimate_at_observed_load(with_prefill, sample.shape, running, rate or 0.0)
        tpot_error = (seen.tpot_mean_s - sample.tpot_mean_s) / sample.tpot_mean_s * 100.0
        if counter_decode is not None:
            decode = _smoothed(previous.decode_factor, counter_decode, first, SPEED_BOUNDS)
        elif seen.decode_share >= MIN_DECODE_SHARE_FOR_FIT:
            decode = _smoothed(previous.decode_factor,
                               previous.decode_factor * seen.tpot_mean_s / sample.tpot_mean_s, first, SPEED_BOUNDS)
    if tpot_error is None and ttft_error is None:
        return previous
    counted = counter_decode is not None or counter_prefill is not None
    tpot_tail, ttft_tail = previous.tpot_tail_factor, previous.ttft_tail_factor
    if rate is not None and sample.steady and (sample.tpot_quantile_s or sample.ttft_quantile_s):
        speed = replace(previous, decode_factor=decode, prefill_factor=prefill)
        calibrated = build_replica_model(replace(setup, efficiency=speed.efficiency(setup.efficiency)))
        at = estimate_at_rate(calibrated, sample.shape, rate, sample.slots, sample.quantile)
        if sample.tpot_quantile_s and bool(at.stable) and float(at.tpot_quantile_s) > 0:
            tpot_tail = _smoothed(previous.tpot_tail_factor, sample.tpot_quantile_s / float(at.tpot_quantile_s),
                                  first, TAIL_BOUNDS, sample.tail_weight())
        if sample.ttft_quantile_s and bool(at.stable) and float(at.ttft_quantile_s) > 0:
            ttft_tail = _smoothed(previous.ttft_tail_factor, sample.ttft_quantile_s / float(at.ttft_quantile_s),
                                  first, TAIL_BOUNDS, sample.tail_weight(TTFT_TAIL_EVIDENCE_REQUESTS))
    return _with_shape(replace(
        previous, decode_factor=decode, prefill_factor=prefill, tpot_tail_factor=tpot_tail,
        ttft_tail_factor=ttft_tail, tpot_error_pct=tpot_error, ttft_error_pct=ttft_error,
        samples=previous.samples + 1,
        speed_fit_from=SpeedFitSource.ENGINE_COUNTERS if counted else SpeedFitSource.LATENCIES,
        achieved_hbm_bandwidth_bytes_per_s=_smoothed_if_measured(previous.achieved_hbm_bandwidth_bytes_per_s,
                                                                 achieved.hbm_bandwidth_bytes_per_s),
        achieved_flops_per_s=_smoothed_if_measured(previous.achieved_flops_per_s, achieved.flops_per_s)), sample)


def shape_weight(new_requests: float | None, requests_seen: float) -> float:
    """The weight of a window's request shape in the smoothed one: its new requests over those seen
    (SHAPE_MEMORY_REQUESTS at most) plus them; whole where none were seen before, and per window
    (SMOOTHING) where the window's count is unknown."""
    if new_requests is None:
        return 1.0 if requests_seen <= 0.0 else SMOOTHING
    if new_requests <= 0.0:
        return 0.0
    return new_requests / (min(requests_seen, SHAPE_MEMORY_REQUESTS) + new_requests)


def _with_shape(calibration: Calibration, sample: CalibrationSample) -> Calibration:
    """The smoothed request shape updated with the window's, in proportion to the requests it saw."""
    # A shape kept by an older operator, without its count, stands for a full memory of requests.
    seen = calibration.shape_requests
    if seen is None:
        seen = 0.0 if calibration.input_tokens is None else SHAPE_MEMORY_REQUESTS
    weight = shape_weight(sample.new_requests, seen)
    if weight <= 0.0:
        return calibration  # no request finished: nothing to learn about their lengths
    tail = calibration.input_tokens_tail
    if sample.shape.input_tokens_tail is not None:
        tail = _weighted(calibration.input_tokens_tail, sample.shape.input_tokens_tail, weight)
    hit_rate = calibration.prefix_cache_hit_rate
    if sample.prefix_cache_hit_rate is not None:
        hit_rate = _weighted(hit_rate, sample.prefix_cache_hit_rate, weight)
    return replace(calibration, input_tokens=_weighted(calibration.input_tokens, sample.shape.input_tokens, weight),
                   output_tokens=_weighted(calibration.output_tokens, sample.shape.output_tokens, weight),
                   input_tokens_tail=tail, prefix_cache_hit_rate=hit_rate,
                   shape_requests=calibration.shape_requests if sample.new_requests is None
                   else min(seen + sample.new_requests, SHAPE_MEMORY_REQUESTS))

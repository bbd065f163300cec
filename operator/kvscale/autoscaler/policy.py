"""The scaling policy: a pure function from what is observed to how many replicas to run, and why.

    decide(observation, context, history, now_s) -> ScaleDecision

Demand (requests/s × tokens) is set against each replica's calibrated goodput at the SLOs, with
headroom. Demand is the larger of the arrivals forecast one measured start-up plus one decision
ahead (kvscale.autoscaler.forecast: the forecaster its rolling backtest favours, never below now) and
the latest burst: the arrivals plus the busiest 30 s above the mean beyond Poisson noise. Bursts
of seconds end before a new replica is Ready, so a burst's demand stands for the scale-down window
(only where the peak was a burst: a steady demand is not held twice, nor a surge's edges). Where every
Ready replica has a queue and none is starting, the arrivals now count the queue's growth since the
previous decision (a surge's first seconds; a minute's average trails them by a replica per decision). Breaches of
the observed percentile TTFT/TPOT beyond a 10% tolerance or a growing queue add replicas. Scale-up
is fast (its stabilization window defaults to zero) and bounded per step; scale-down waits for its
window and then steps down gently, not at all while the load climbs, and where demand peaks recur,
not below a fleet sized for the last peak until one period and a start-up after it; where they are
shorter than a start-up, the fleet stands at what the last peak showed it needs, and no replica that
would be Ready only after a peak is started for it. Until the arrivals history covers
spec.scaling.statedLoadFloorSeconds (an hour), no scale-down goes below the fleet planned for the stated
workload: a deployment's first minutes need not show its peaks. Missing, stale or implausible
metrics never scale down. The
operator (in Auto or Recommend mode) and the simulator call this same function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

import numpy as np

from kvscale.api.spec import ForecastMode, LLMDeploymentSpec
from kvscale.autoscaler.calibration import Calibration, CalibrationSample
from kvscale.autoscaler.engine_work import EngineWork
from kvscale.autoscaler.forecast import BUCKET_S, Forecast, Forecaster, ForecastState
from kvscale.autoscaler.signals import PEAK_RATE_INTERVAL_S, Observation, check_observation
from kvscale.perfmodel import (
    ReplicaModel,
    RequestShape,
    ServingSetup,
    build_replica_model,
    estimate_at_rate,
    estimate_goodput,
)
from kvscale.perfmodel.serving import max_request_rate
from kvscale.planner.search import planned_shape
from kvscale.units import ms_to_s

MAX_SCALE_UP_STEP = 4  # HPA's default: at most 4 pods or 100% more per decision, whichever is larger
MAX_SCALE_DOWN_FRACTION = 0.25  # at most a quarter fewer per decision (and at least one)
QUEUE_DRAIN_S = 30.0  # replicas are added so that the waiting queue drains within this time
METRICS_MAX_AGE_S = 120.0
HISTORY_LIMIT_S = 86_400.0
# A replica added now serves only after it has started (pod, image, model load: ~2 min for vLLM), so
# demand is sized for where the forecast puts it one start-up (and one decision) later; at most this
# much above now. The start-up is the deployment's measured one; this until one is measured.
REPLICA_STARTUP_S = 120.0
MAX_FORECAST_GROWTH = 2.0
IN_FLIGHT_WINDOW_S = 60.0
# A burst's peak beyond this many standard deviations of Poisson noise around the mean is clustering
# the goodput model (Poisson arrivals) does not allow for.
POISSON_PEAK_SIGMAS = 2.0
# Demand is kept this long for the trend and for burst peaks (a longer scale-down window keeps them longer).
DEMAND_MEMORY_S = 2 * REPLICA_STARTUP_S
# HPA's tolerance: an observed percentile within 10% of its SLO over one window is mostly a burst's
# passing queue, which the burst term sizes for; counting it as a shortfall of replicas each time
# ratchets the fleet up, window after window, for the length of the scale-down window.
BREACH_TOLERANCE = 0.1
# A load rises (and no replica goes) while Holt's trend expects a rise beyond noise and each of the last
# this many closed minutes was busier than the one before: a trend alone outlives the rise that set it.
RISING_BUCKETS = 3
# Where the calibrated model says no load meets the SLOs (the servers are slower than they allow), no
# replica count restores them; replicas are then sized for throughput, at this share of a replica's
# saturation rate, so the queue stays bounded and the fleet still follows the load (holding it instead
# kept a surge's replicas for good once the surge had gone).
UNATTAINABLE_SLO_LOAD = 0.8
# The light load (this share of a window's rate) at which the model must hold the SLOs for a window beyond its
# goodput to count as overloaded rather than as evidence against the model (_overloaded).
LIGHT_LOAD_SHARE = 0.1
# Recurring peaks (a batch job every few minutes, a surge every quarter hour) come back sooner than the
# scale-down window lets a fleet stand, and each return then waits for a start-up. The last
# PATTERN_MEMORY_S of arrival minutes are searched for such a pattern (and the decisions' demands kept as
# long, for the size of its peaks): minutes above PATTERN_PEAK_FACTOR x the median minute (and Poisson
# noise), at least PATTERN_MIN_PEAKS peaks at most PATTERN_MAX_PERIOD_S apart, whose gaps differ by at
# most PATTERN_REGULARITY x. Two peaks suffice: on an hour of 15-minute surges a third comes too late to
# matter (tuned on the spikes and surges cases, docs/benchmarks.md). A period up to 40 minutes: at 30 the
# gaps between detected crests come out a minute over 30, and a cycle that fast rises within 15 minutes,
# too soon for the trend to lead a start-up (a 30-min cycle: 97.10% -> 99.03% attainment; tuned there,
# reported on held-out cycles, docs/benchmarks.md).
PATTERN_MEMORY_S = 3_600.0
PATTERN_PEAK_FACTOR = 1.5
PATTERN_MIN_PEAKS = 2
PATTERN_MAX_PERIOD_S = 2_400.0
PATTERN_REGULARITY = 2.0
# Where the peaks are shorter than a start-up, the fleet that stands for them is learned from how the last
# peaks were served, and only the last this many bound it: a bursty trace's peaks differ, and an hour of
# them held the fleet at the hour's worst (code x1 with its peak stated: +10% GPU-hours for -0.16 points;
# tuned on the tuning cases, docs/benchmarks.md).
PATTERN_EVIDENCE_PEAKS = 2


@dataclass(frozen=True)
class ReplicaContext:
    """What the policy needs to know about one deployment besides its load."""

    spec: LLMDeploymentSpec
    setup: ServingSetup  # the planned configuration of one replica (TP, GPU, precision, ...)
    max_num_seqs: int  # sequences a replica runs at once (every data-parallel engine's --max-num-seqs)
    kv_cache_tokens: int
    current_replicas: int  # desired replicas now (the Deployment's spec.replicas)
    ready_replicas: int
    free_replica_slots: int | None  # how many more replicas the free GPUs of that type hold; None: unknown
    calibration: Calibration = field(default_factory=Calibration)
    startup_s: float = REPLICA_STARTUP_S  # a new replica's measured time to Ready (a high percentile)
    decision_interval_s: float = 30.0  # how often the policy runs: a scale-up waits for the next one
    forecaster: Forecaster | None = None  # pinned by the spec; None: the one the backtest chooses


@dataclass(frozen=True)
class PeakFleet:
    """The fleet to stand for the next of a pattern's peaks, learned from how the last ones were served
    (ScalingHistory.peak_fleet)."""

    replicas: int
    reason: str  # how the last peak was served
    any_held: bool  # a fleet of the last peaks held one: the answer needs no model-sized floor


@dataclass(frozen=True)
class PeakPattern:
    """Demand peaks that recur (ScalingHistory.peak_pattern), from the forecasts' one-minute buckets."""

    period_s: float  # the longest gap between two peaks' starts
    length_s: float  # the longest peak (whole minutes above the threshold; a rate window smears a spike over two)
    ongoing_s: float  # how long the peak under way has lasted (0: none is)
    peaks: tuple[tuple[float, float], ...]  # (start_s, end_s) of each peak that has ended, oldest first

    def short(self, startup_s: float) -> bool:
        """Peaks that end before a replica asked for at their start is Ready (the measured start-up), while the
        one under way, if any, has not outlasted them: replicas added for such a peak serve only the calm
        after it."""
        return self.length_s <= startup_s and self.ongoing_s <= self.length_s


def peak_threshold_rps(minutes: Sequence[float]) -> float:
    """The arrival rate (req/s) above which a one-minute bucket is a peak's: PATTERN_PEAK_FACTOR x the median
    minute, and beyond the median's Poisson noise (a quiet deployment's median is too small for the factor
    alone to clear its noise)."""
    median = float(np.median(minutes)) if len(minutes) else 0.0
    return max(PATTERN_PEAK_FACTOR * median,
               median + POISSON_PEAK_SIGMAS * math.sqrt(max(median, 0.0) / BUCKET_S))


@dataclass(frozen=True)
class ScalingHistory:
    """Past recommendations (time_s, replicas), newest last, for the stabilization windows."""

    recommendations: tuple[tuple[float, int], ...] = ()
    started_at_s: float | None = None  # when this history began (after a restart, nothing older is known)
    # (time_s, arrivals/s, requests in flight, arrivals/s of a burst: 0 when the peak was Poisson noise)
    # seen, for the trend and the bursts
    demands: tuple[tuple[float, float, float, float], ...] = ()
    forecasts: ForecastState = field(default_factory=ForecastState)  # arrivals, bucketed, and the backtest
    # (time_s, Ready replicas, the window's worst percentile over its SLO: TTFT or TPOT, 0 where neither was
    # observed) at each decision: which fleet served the requests of a rate window, and how well
    ready_seen: tuple[tuple[float, int, float], ...] = ()
    # (time_s, replicas) a recurring-peak rule stood above the demand's recommendation: when the pattern is no
    # longer seen, that fleet leaves through the scale-down window like any recommendation, not at once
    standing: tuple[tuple[float, int], ...] = ()
    last_scale_down_s: float | None = None  # when a decision last removed replicas (scaleDownPeriodSeconds)

    def add(self, now_s: float, replicas: int) -> ScalingHistory:
        kept = tuple((t, r) for t, r in self.recommendations if now_s - t <= HISTORY_LIMIT_S)
        return replace(self, recommendations=(*kept, (now_s, replicas)),
                       started_at_s=self.started_at_s if self.started_at_s is not None else now_s)

    def with_demand(self, now_s: float, arrivals: float, in_flight: float, burst_arrivals: float = 0.0,
                    memory_s: float = DEMAND_MEMORY_S) -> ScalingHistory:
        kept = tuple(d for d in self.demands if now_s - d[0] <= max(DEMAND_MEMORY_S, memory_s, PATTERN_MEMORY_S))
        return replace(self, demands=(*kept, (now_s, arrivals, in_flight, max(burst_arrivals, 0.0))))

    def arrivals(self, now_s: float, finished_rate: float, in_flight: float, saturated: bool = False) -> float:
        """Arrivals/s: finished requests plus the growth of those in flight (running and waiting) over
        the last window. Finished requests alone lag arrivals by a request's latency, which at a
        deployment's first minutes, or a surge, is most of the story. Where the replicas are saturated
        (a queue on each), what finishes is capped by the fleet and the queue's growth is the whole
        excess of arrivals: it counts since the previous decision too, whichever is faster, since a
        minute's average of a surge's first seconds is a quarter of it."""
        recent = [d for d in self.demands if 0 < now_s - d[0] <= IN_FLIGHT_WINDOW_S]
        if not recent:
            return finished_rate
        then_s, _, then_in_flight, _ = recent[0]
        growth = (in_flight - then_in_flight) / (now_s - then_s)
        if saturated:
            last_s, _, last_in_flight, _ = recent[-1]
            growth = max(growth, (in_flight - last_in_flight) / (now_s - last_s))
        return finished_rate + max(0.0, growth)

    def recent_burst(self, now_s: float, lookback_s: float, rate_window_s: float) -> float:
        """The arrivals/s of the largest burst of the last `lookback_s` where bursts recur (two or more
        separate ones in the last two lookbacks); else 0. Only windows whose peak Poisson noise does not
        explain count, and a single one is not held either: a load that drops looks like one (its
        earlier peak is still in the rate window), and must scale down after one window. Nor is a burst
        no higher than a load the rate windows held from one rate window before it until now: either that
        was a surge's rising edge, its level since sustained, or its falling edge, the level leaving the
        window (its peak sits early in a window whose mean has fallen); both go with the scale-down
        window like any demand."""
        remembered = [(t, b) for t, _, _, b in self.demands if now_s - t <= 2 * lookback_s]
        starts = sum(1 for i, (_, b) in enumerate(remembered) if b > 0 and (i == 0 or remembered[i - 1][1] <= 0))
        if starts < 2:
            return 0.0
        return max((b for t, b in remembered
                    if now_s - t <= lookback_s and b > self.level_between(t - rate_window_s, now_s)), default=0.0)

    def peak_pattern(self, now_s: float) -> PeakPattern | None:
        """Recurring demand peaks over the last PATTERN_MEMORY_S, or None where no regular pattern shows:
        fewer than PATTERN_MIN_PEAKS peaks, or gaps too uneven (bursts at random are the burst terms'
        business; holding for their longest gap holds a fleet for nothing). Read off the forecasts'
        one-minute arrival buckets, which a restarted operator seeds from Prometheus: the pattern survives
        a restart. A peak is a run of minutes above PATTERN_PEAK_FACTOR x the median minute and beyond
        Poisson noise, which starts after a minute below it."""
        forecasts = self.forecasts
        if forecasts.bucket_index is None:
            return None
        minutes = forecasts.day[-int(PATTERN_MEMORY_S // BUCKET_S):]
        first = forecasts.bucket_index - len(minutes)
        if len(minutes) < 2 * PATTERN_MIN_PEAKS:
            return None
        threshold = peak_threshold_rps(minutes)
        runs: list[tuple[float, float]] = []  # (start_s, end_s) of each peak; the last one's end: now, if open
        start: int | None = None
        for i, rate in enumerate(minutes):
            if rate > threshold and start is None and i > 0 and minutes[i - 1] <= threshold:
                start = i
            elif rate <= threshold and start is not None:
                runs.append(((first + start) * BUCKET_S, (first + i) * BUCKET_S))
                start = None
        ongoing_s = 0.0
        if start is not None:
            runs.append(((first + start) * BUCKET_S, forecasts.bucket_index * BUCKET_S))
            ongoing_s = runs[-1][1] - runs[-1][0]
        starts = [s for s, _ in runs]
        if len(starts) < PATTERN_MIN_PEAKS:
            return None
        gaps = [b - a for a, b in pairwise(starts)]
        if (max(gaps) > PATTERN_MAX_PERIOD_S or max(gaps) > PATTERN_REGULARITY * min(gaps)
                or now_s - starts[-1] > PATTERN_REGULARITY * max(gaps)):
            return None
        closed = runs[:-1] if ongoing_s > 0 else runs
        return PeakPattern(period_s=max(gaps), length_s=max((e - s for s, e in closed), default=ongoing_s),
                           ongoing_s=ongoing_s, peaks=tuple(closed))

    def recurrence_s(self, now_s: float) -> float | None:
        """The period of recurring demand peaks (the longest gap between their starts), or None."""
        pattern = self.peak_pattern(now_s)
        return None if pattern is None else pattern.period_s

    def peak_fleet(self, pattern: PeakPattern, window_s: float) -> PeakFleet | None:
        """The fleet for the next of `pattern`'s peaks, learned from how the last one was served: the fewest
        Ready replicas over its rate windows, and the worst percentile they reported against the SLO. Each
        of the last PATTERN_EVIDENCE_PEAKS peaks bounds the answer: a fleet that breached one is too small,
        one that held one is enough. A breach beyond BREACH_TOLERANCE asks
        for more, as a breach's correction does, but no more than the smallest fleet seen holding a peak;
        a peak held lowers the fleet towards its share of the SLO used, by at most MAX_SCALE_DOWN_FRACTION
        per peak, and never to a fleet that breached. None before a peak's decisions were seen (after a
        restart)."""
        served = []
        for start_s, end_s in pattern.peaks:
            seen = [(r, q) for t, r, q in self.ready_seen if start_s - window_s <= t <= end_s + window_s]
            if seen:
                served.append((min(r for r, _ in seen), max(q for _, q in seen)))
        if not served:
            return None
        ready, worst = served[-1]
        served = served[-PATTERN_EVIDENCE_PEAKS:]
        breached = [r for r, q in served if q > 1.0 + BREACH_TOLERANCE]
        held = [r for r, q in served if q <= 1.0 + BREACH_TOLERANCE]
        if worst > 1.0 + BREACH_TOLERANCE:
            fleet = max(ready + 1, math.ceil(ready * min(worst, 2.0)))
            fleet = min([fleet] + [r for r in held if r > ready])
            how = f"breached (worst window {worst:.2f}x its SLO) with {ready} Ready"
        else:
            fleet = min(ready, max(math.ceil(ready * worst - 1e-9),
                                   ready - max(1, math.floor(ready * MAX_SCALE_DOWN_FRACTION))))
            how = f"held (worst window {worst:.2f}x its SLO) with {ready} Ready"
        fleet = max(fleet, max(breached, default=0) + 1, 1)
        return PeakFleet(fleet, f"the last peak {how}", bool(held))

    def with_ready(self, now_s: float, ready: int, slo_ratio: float = 0.0) -> ScalingHistory:
        kept = tuple(seen for seen in self.ready_seen if now_s - seen[0] <= max(DEMAND_MEMORY_S, PATTERN_MEMORY_S))
        return replace(self, ready_seen=(*kept, (now_s, ready, slo_ratio)))

    def fewest_ready(self, now_s: float, lookback_s: float, ready: int) -> int:
        """The fewest Ready replicas seen at a decision of the last `lookback_s` (and `ready` now): a
        percentile over that window is set by its worst stretch, which that fleet served."""
        return min([r for t, r, _ in self.ready_seen if now_s - t <= lookback_s] + [ready])

    def level_between(self, from_s: float, to_s: float) -> float:
        """The highest demand (a window's mean arrivals/s) recorded from `from_s` until before `to_s`: a
        load held over that time. A peak no higher is that level entering or leaving a window, not a burst."""
        return max((d for t, d, _, _ in self.demands if from_s <= t < to_s), default=0.0)

    def within(self, now_s: float, window_s: float) -> list[int]:
        return [r for t, r in self.recommendations if now_s - t <= window_s]

    def with_standing(self, now_s: float, replicas: int, window_s: float) -> ScalingHistory:
        kept = tuple((t, r) for t, r in self.standing if now_s - t <= window_s)
        return replace(self, standing=(*kept, (now_s, replicas)))

    def stood_within(self, now_s: float, window_s: float) -> list[int]:
        return [r for t, r in self.standing if now_s - t <= window_s]


@dataclass(frozen=True)
class ScaleDecision:
    """The policy's answer: the replicas to run, the raw recommendation, and why (in numbers)."""

    desired_replicas: int
    recommended_replicas: int
    reason: str
    action: str  # scale-up, scale-down, hold
    # demand, ttft, tpot, queue, min-replicas, max-replicas, capacity, metrics, stabilization, trend, pattern,
    # pace, stated-load
    binding: str
    metrics_problem: str | None = None
    capacity_limited: bool = False
    goodput_requests_per_s: float | None = None  # per replica, calibrated
    history: ScalingHistory = field(default_factory=ScalingHistory)
    forecast: Forecast | None = None  # the arrivals forecast the demand was sized for


_PINNED = {ForecastMode.LAST_VALUE: Forecaster.LAST_VALUE, ForecastMode.HOLT_WINTERS: Forecaster.HOLT_WINTERS,
           ForecastMode.BURST_ENVELOPE: Forecaster.BURST_ENVELOPE}


def forecaster_of(spec: LLMDeploymentSpec) -> Forecaster | None:
    """The forecaster the spec pins, or None where the backtest chooses (Auto)."""
    return _PINNED.get(spec.scaling.forecaster)


def replica_slots(context: ReplicaContext, shape: RequestShape) -> int:
    """Sequences one replica runs at once: max-num-seqs, or fewer when the KV cache holds fewer."""
    by_cache = int(context.kv_cache_tokens // max(shape.input_tokens + shape.output_tokens, 1.0))
    return min(context.max_num_seqs, max(1, by_cache))


def calibrated_replica_model(context: ReplicaContext) -> ReplicaModel:
    """The replica's model with the calibrated speed factors."""
    return build_replica_model(replace(context.setup,
                                       efficiency=context.calibration.efficiency(context.setup.efficiency)))


def replica_goodput(context: ReplicaContext, shape: RequestShape, model: ReplicaModel | None = None) -> float:
    """Requests/s one replica sustains with both SLOs held, under the calibrated model (`model`, built
    here when not given): its speed factors rescale the model, its tail factors tighten the SLOs to
    what the model's percentiles must stay under for the real percentiles to meet them."""
    calibration = context.calibration
    model = model or calibrated_replica_model(context)
    slo = context.spec.slo
    slots = np.array([replica_slots(context, shape)], dtype=np.float64)
    ttft_s = ms_to_s(slo.ttft_ms) / calibration.ttft_tail_factor
    tpot_s = ms_to_s(slo.tpot_ms) / calibration.tpot_tail_factor
    burstiness = context.spec.scaling.arrival_burstiness
    goodput = float(estimate_goodput(model, shape, slots, ttft_s, tpot_s, slo.percentile / 100.0, burstiness)
                    .request_rate[0])
    if goodput <= 0.0 and shape.input_tokens_tail is not None:
        # The longest prompts alone miss the TTFT SLO: no replica count fixes those, so size for the rest.
        untailed = replace(shape, input_tokens_tail=None)
        goodput = float(estimate_goodput(model, untailed, slots, ttft_s, tpot_s, slo.percentile / 100.0, burstiness)
                        .request_rate[0])
    return goodput


def replica_throughput(context: ReplicaContext, shape: RequestShape, model: ReplicaModel | None = None) -> float:
    """Requests/s one replica serves at UNATTAINABLE_SLO_LOAD of its saturation, under the calibrated
    model: the sizing rate where no load meets the SLOs."""
    slots = np.array([replica_slots(context, shape)], dtype=np.float64)
    model = model or calibrated_replica_model(context)
    return UNATTAINABLE_SLO_LOAD * float(max_request_rate(model, shape, slots)[0])


def build_calibration_sample(context: ReplicaContext, observation: Observation, *,
                             prefill_mean_s: float | None) -> CalibrationSample:
    """One window's calibration input, per replica. Percentiles only count as steady (tail-worthy) when
    nothing queues and no replica is starting. The operator and the simulator both build it here."""
    pods = max(observation.pods_scraped, 1)
    # The batch the window's tokens were decoded at: its mean over the window; one instant's gauge
    # only where the mean is missing.
    running = observation.mean_running_requests
    if running is None:
        running = observation.running_requests or 0.0
    shape = _shape(observation, context.spec)
    prefill_tail_s = observation.prefill_quantile_s  # None where its histogram cannot resolve it
    if prefill_tail_s and prefill_mean_s and prefill_tail_s > prefill_mean_s:
        # The percentile prompt, in tokens: prefill time grows with prompt length at the window's load.
        shape = replace(shape, input_tokens_tail=shape.input_tokens * prefill_tail_s / prefill_mean_s)
    elif prefill_tail_s is None and observation.input_tokens_quantile:
        # Prefills too fast for the prefill-time buckets: the prompt-length histogram is what is left.
        shape = replace(shape, input_tokens_tail=max(observation.input_tokens_quantile, shape.input_tokens))
    rate = observation.request_rate
    bursty = rate is not None and _burst_excess(observation, rate) > 0.0
    queued = (observation.waiting_requests or 0.0) / pods >= 1.0 or _drained_a_backlog(observation, context.spec)
    rate_per_replica = None if rate is None else rate / pods
    return CalibrationSample(
        shape=shape, quantile=context.spec.slo.percentile / 100.0, running_per_replica=running / pods,
        rate_per_replica=rate_per_replica, slots=float(replica_slots(context, shape)),
        tpot_mean_s=observation.tpot_mean_s, tpot_quantile_s=observation.tpot_s, ttft_quantile_s=observation.ttft_s,
        prefill_mean_s=prefill_mean_s, bursty=bursty,
        overloaded=rate_per_replica is not None and _overloaded(context, observation, rate_per_replica),
        # Windows with a replica starting are left out too. Its pod serves no /metrics yet, so the
        # per-pod figures would be the serving pods' own, but taking those windows (a ramp's, a burst's
        # aftermath) cost 2 points of attainment on the bursty code trace (docs/operator.md).
        steady=not queued and context.ready_replicas >= context.current_replicas, queued=queued,
        prefix_cache_hit_rate=observation.prefix_cache_hit_rate, engine_work=_engine_work(observation),
        # Windows overlap when decisions come faster than a window: the requests new since the last one.
        new_requests=None if rate is None else rate * min(observation.window_s, context.decision_interval_s),
        window_requests=None if rate is None else rate * observation.window_s)


def _overloaded(context: ReplicaContext, observation: Observation, rate_per_replica: float) -> bool:
    """Whether the window breached an SLO (beyond BREACH_TOLERANCE) at a per-replica rate at which the
    calibrated model predicts a breach too, while it predicts the SLOs held at a light load: a load beyond
    the goodput, which the policy already sizes up for (CalibrationSample.overloaded). A model that breaches
    at every load (no goodput) or that meets the SLOs at the window's rate is still fitted: only a fit shows
    it wrong. Where the longest prompts alone miss the TTFT SLO, the rest of the requests are judged, as
    replica_goodput sizes for them."""
    spec = context.spec
    if rate_per_replica <= 0.0 or _slo_ratio(observation, spec) <= 1.0 + BREACH_TOLERANCE:
        return False
    shape = calibrated_shape(context, observation)
    model = calibrated_replica_model(context)
    rates = np.array([LIGHT_LOAD_SHARE * rate_per_replica, rate_per_replica])
    held = _slos_held(context, model, shape, rates)
    if not held[0] and shape.input_tokens_tail is not None:
        held = _slos_held(context, model, replace(shape, input_tokens_tail=None), rates)
    return bool(held[0]) and not bool(held[1])


def _slos_held(context: ReplicaContext, model: ReplicaModel, shape: RequestShape,
               rates_per_replica: np.ndarray) -> np.ndarray:
    """Per rate, whether the calibrated model (its tail factors included) holds both SLOs there."""
    calibration, slo = context.calibration, context.spec.slo
    at = estimate_at_rate(model, shape, rates_per_replica, float(replica_slots(context, shape)),
                          slo.percentile / 100.0)
    return ((np.asarray(at.stable, dtype=bool))
            & (np.asarray(at.ttft_quantile_s) * calibration.ttft_tail_factor <= ms_to_s(slo.ttft_ms))
            & (np.asarray(at.tpot_quantile_s) * calibration.tpot_tail_factor <= ms_to_s(slo.tpot_ms)))


def calibrated_shape(context: ReplicaContext, observation: Observation) -> RequestShape:
    """The window's request shape as the calibrated model sizes for it: the observed mean, the percentile
    prompt assumed as the plan assumes it until calibration has seen it, then calibration's own."""
    return context.calibration.shape(_with_assumed_tail(_shape(observation, context.spec), context.spec))


def _drained_a_backlog(observation: Observation, spec: LLMDeploymentSpec) -> bool:
    """Whether the window's requests waited for a slot, on average, beyond BREACH_TOLERANCE of the TTFT
    SLO. Its TTFT percentile then measures a backlog left by an earlier, heavier load (a surge's
    aftermath, when the queue is empty again but the window still holds its requests) against the
    window's lighter rate: as a tail factor that would shrink goodput several-fold after every surge."""
    queued_s = observation.mean_queue_time_s
    return queued_s is not None and queued_s > BREACH_TOLERANCE * ms_to_s(spec.slo.ttft_ms)


def _engine_work(observation: Observation) -> EngineWork | None:
    """The engine's work counters, already per GPU of one engine (one engine is one replica)."""
    flops, hbm_bytes = observation.estimated_flops_per_s_per_gpu, observation.estimated_hbm_bytes_per_s_per_gpu
    steps = observation.engine_steps_per_s
    if flops is None or hbm_bytes is None or steps is None:
        return None
    return EngineWork(flops_per_s=flops, hbm_bytes_per_s=hbm_bytes, steps_per_s=steps)


def _shape(observation: Observation, spec: LLMDeploymentSpec) -> RequestShape:
    """The observed mean request shape, falling back to the spec's expectation where a window saw nothing
    (for the prefix-cache hit rate: where the engine does not export it)."""
    inputs = observation.mean_input_tokens or spec.workload.input_tokens
    outputs = observation.mean_output_tokens or spec.workload.output_tokens
    hit_rate = observation.prefix_cache_hit_rate
    if hit_rate is None:
        hit_rate = planned_shape(spec).prefix_cache_hit_rate  # the spec's expectation
    observed = planned_shape(spec).rescaled(float(max(inputs, 1.0)), float(max(outputs, 1.0)))
    return replace(observed, input_tokens_tail=None, prefix_cache_hit_rate=hit_rate)


def _with_assumed_tail(shape: RequestShape, spec: LLMDeploymentSpec) -> RequestShape:
    """Until calibration has seen the percentile prompt, it is assumed as the plan assumes it, in
    proportion to the observed mean prompt."""
    planned = planned_shape(spec)
    return replace(shape, input_tokens_tail=planned.tail_input_tokens * shape.input_tokens / planned.input_tokens)


def _shape_text(shape: RequestShape, spec: LLMDeploymentSpec) -> str:
    """The request shape the goodput holds for: goodput is per request, so it means little without it."""
    tail = "" if shape.input_tokens_tail is None else f", p{spec.slo.percentile:g} {shape.input_tokens_tail:.0f}"
    return f" (prompts {shape.input_tokens:.0f}{tail}, outputs {shape.output_tokens:.0f} tokens)"


def _in_flight(observation: Observation) -> float:
    return (observation.running_requests or 0.0) + (observation.waiting_requests or 0.0)


@dataclass(frozen=True)
class Fleet:
    """The replicas a decision sees: those asked for (at least one), those Ready (at least one, and no more
    than asked for), and whether any is still starting."""

    current: int
    ready: int
    starting: bool

    @classmethod
    def of(cls, context: ReplicaContext) -> Fleet:
        current = max(context.current_replicas, 1)
        return cls(current=current, ready=max(min(context.ready_replicas, current), 1),
                   starting=context.ready_replicas < context.current_replicas)


def _saturated(observation: Observation, context: ReplicaContext, fleet: Fleet) -> bool:
    """A queue on every Ready replica, beyond a tenth of its slots (at least one request), and no replica
    starting: its slots are full, and what it finishes is its capacity, not the arrivals. While replicas
    start, the queue grows because the capacity asked for is not up yet."""
    queue_per_replica = (observation.waiting_requests or 0.0) / fleet.ready
    return not fleet.starting and queue_per_replica > max(1.0, 0.1 * context.max_num_seqs)


def _arrivals(observation: Observation, history: ScalingHistory, saturated: bool = False) -> float:
    return history.arrivals(observation.sampled_at_s, observation.request_rate or 0.0, _in_flight(observation),
                            saturated)


def _burst_excess(observation: Observation, mean: float) -> float:
    """Arrivals/s of the window's busiest interval above its mean arrivals, beyond what Poisson noise
    explains (2 sigma): the goodput model already allows for Poisson arrivals, not for bursts of seconds."""
    peak = observation.peak_request_rate
    if peak is None:
        return 0.0
    noise = POISSON_PEAK_SIGMAS * math.sqrt(max(mean, 0.0) / PEAK_RATE_INTERVAL_S)
    return max(0.0, peak - noise - mean)


def _hold(context: ReplicaContext, history: ScalingHistory, reason: str, problem: str) -> ScaleDecision:
    current = context.current_replicas
    return ScaleDecision(desired_replicas=current, recommended_replicas=current, reason=reason, action="hold",
                         binding="metrics", metrics_problem=problem, history=history)


def _expected_arrivals(arrivals: float, forecast: Forecast, forecasts: ForecastState) -> float:
    """Arrivals/s to size for: what arrives now plus the rise the forecast expects one horizon ahead;
    never below now (scale-down is the stabilization window's business) and at most
    MAX_FORECAST_GROWTH times the recent load."""
    ceiling = MAX_FORECAST_GROWTH * max(arrivals, forecasts.recent_peak)
    return max(arrivals, min(arrivals + forecast.rise_per_s, ceiling))


def _trend_rise(forecasts: ForecastState, arrivals: float) -> float | None:
    """The rise in arrivals/s Holt's trend expects by the horizon where it exceeds the noise of counting
    a minute's arrivals; else None. Whatever forecaster sizes demand, a replica removed while the load
    climbs is one to start again a start-up later (a breach's correction, once the breach clears, would
    otherwise be taken back half-way up a ramp). A load now below its last closed minute (beyond noise)
    has stopped climbing, however the minutes before rose: a surge that ended."""
    rise = forecasts.forecast(Forecaster.HOLT_WINTERS).rise_per_s
    noise = max(POISSON_PEAK_SIGMAS * math.sqrt(max(arrivals, 0.0) / BUCKET_S), 1.0 / BUCKET_S)
    recent = forecasts.recent[-RISING_BUCKETS:]
    climbing = (len(recent) == RISING_BUCKETS and all(b > a for a, b in pairwise(recent))
                and arrivals >= recent[-1] - noise)
    return rise if rise > noise and climbing else None


def _recommend(observation: Observation, context: ReplicaContext, fleet: Fleet, goodput: float,
               history: ScalingHistory, arrivals: float, burst_excess: float, shape: RequestShape,
               forecast: Forecast, slo_attainable: bool) -> tuple[int, str, list[str]]:
    """(replicas, binding, reasons) from demand and SLO/queue corrections, before bounds and windows.

    Corrections for breaches and queues scale from Ready replicas only: replicas still loading a model
    will relieve the breach when they come up, so asking again for each of their start-up cycles
    would compound the same shortfall; a breach larger than they cover still asks for more.
    """
    spec = context.spec
    current, ready, starting = fleet.current, fleet.ready, fleet.starting
    waiting = observation.waiting_requests or 0.0
    # Arrivals, plus what is piling up in the queue, which should drain within QUEUE_DRAIN_S.
    arrival = arrivals + waiting / QUEUE_DRAIN_S
    trended = _expected_arrivals(arrivals, forecast, history.forecasts) + waiting / QUEUE_DRAIN_S
    window_s = spec.scaling.scale_down_stabilization_seconds
    burst = max(arrival + burst_excess, history.recent_burst(observation.sampled_at_s, window_s, observation.window_s))
    expected = max(trended, burst)
    load = expected * (1.0 + spec.scaling.headroom) / goodput if goodput > 0 else float(current)  # replicas' worth
    sized = wanted = math.ceil(load - 1e-9)
    down_text = ""
    tolerance = spec.scaling.scale_down_tolerance
    if wanted < current and tolerance > 0:
        # Fewer only where they would run below (1 - tolerance) of their goodput: a fleet sized to the edge
        # of the noise in the arrivals and the calibrated goodput asks for the replica back minutes later.
        kept = min(current, math.ceil(load / (1.0 - tolerance) - 1e-9))
        if kept > wanted:
            down_text = (f", kept at {kept}: {sized} would run at {load / sized:.0%} of their goodput, above the "
                         f"scale-down tolerance's {1 - tolerance:.0%}")
            wanted = kept
    binding = "demand"
    trend = ""
    if burst > max(trended, arrival) + 1e-9:
        trend = f" (bursts: {burst:.2f} req/s in the last {window_s} s)"
    elif trended > arrival + 1e-9:
        trend = f" ({forecast.forecaster.value} forecast: {trended:.2f} req/s in {forecast.horizon_s:.0f} s)"
    per_replica = (f"calibrated goodput {goodput:.2f} req/s per replica" if slo_attainable else
                   f"{goodput:.2f} req/s per replica ({UNATTAINABLE_SLO_LOAD:.0%} of its throughput: no load meets "
                   "the SLOs under the calibrated model)")
    reasons = [f"demand {arrival:.2f} req/s{trend} x {1 + spec.scaling.headroom:.2f} headroom over "
               f"{per_replica}{_shape_text(shape, spec)} -> {sized}{down_text}"]
    breaches = []
    p = f"p{spec.slo.percentile:g}"
    if observation.ttft_s is not None and observation.ttft_s * 1000.0 > spec.slo.ttft_ms * (1 + BREACH_TOLERANCE):
        ttft_ms = observation.ttft_s * 1000.0
        breaches.append(("ttft", ttft_ms / spec.slo.ttft_ms, f"{p} TTFT {ttft_ms:.0f} ms > SLO {spec.slo.ttft_ms:g}"))
    tpot_ms, tpot_name = _tpot_for_breach(observation, p)
    if tpot_ms is not None and tpot_ms > spec.slo.tpot_ms * (1 + BREACH_TOLERANCE):
        breaches.append(("tpot", tpot_ms / spec.slo.tpot_ms,
                         f"{tpot_name} {tpot_ms:.1f} ms > SLO {spec.slo.tpot_ms:g}"))
    if breaches:
        name, ratio, text = max(breaches, key=lambda b: b[1])
        breached_with = history.fewest_ready(observation.sampled_at_s, observation.window_s, ready)
        if breached_with < ready:
            # The window's percentile was set while fewer replicas served: scaled from those, since the
            # replicas added after them already answer part of it (scaled from today's fleet, one stale
            # window compounded 2 -> 4 -> 7 replicas in 10 s on the demo's bed).
            corrected = math.ceil(breached_with * min(ratio, 2.0))
            text += f" (over a window that {breached_with} Ready replica(s) served)"
        else:
            corrected = max(ready + 1, math.ceil(ready * min(ratio, 2.0)))
        if starting:
            text += f" ({current - context.ready_replicas} replica(s) still starting)"
        if corrected > wanted and (not starting or corrected > current):
            wanted, binding = corrected, name
        reasons.append(text)
    if _saturated(observation, context, fleet):
        drain = ready + math.ceil(waiting / max(goodput * QUEUE_DRAIN_S, 1e-9))
        if drain > wanted:
            wanted, binding = drain, "queue"
        reasons.append(f"{waiting:.0f} requests waiting")
    return wanted, binding, reasons


def _tpot_for_breach(observation: Observation, percentile: str) -> tuple[float | None, str]:
    """(ms, what it is) of the TPOT to hold against the SLO: the percentile where its histogram resolves
    it; where it fell in the first bucket, the mean, which the percentile is at least."""
    if observation.tpot_s is not None:
        return observation.tpot_s * 1000.0, f"{percentile} TPOT"
    if observation.bound_of("tpot_s") is not None and observation.tpot_mean_s is not None:
        return observation.tpot_mean_s * 1000.0, f"mean TPOT ({percentile} below the histogram's resolution)"
    return None, ""


def _slo_ratio(observation: Observation, spec: LLMDeploymentSpec) -> float:
    """The window's worst observed percentile over its SLO, TTFT or TPOT (as breaches read them); 0 where
    neither was observed."""
    ratios = [] if observation.ttft_s is None else [observation.ttft_s * 1000.0 / spec.slo.ttft_ms]
    tpot_ms, _ = _tpot_for_breach(observation, "")
    if tpot_ms is not None:
        ratios.append(tpot_ms / spec.slo.tpot_ms)
    return max(ratios, default=0.0)


def _standing_for_short_peaks(context: ReplicaContext, history: ScalingHistory, pattern: PeakPattern | None,
                              window_s: float, sized: tuple[int, str] | None) -> tuple[int, str] | None:
    """(replicas, why) to stand where recurring peaks are short (PeakPattern.short): a replica asked for at
    such a peak is Ready after it, and stands through the calm for the scale-down window, so reacting to
    each peak pays for replicas that serve none of it. The fleet that serves them is the one that stands
    when they arrive, learned peak by peak from how the last one was served (ScalingHistory.peak_fleet);
    until some fleet has held a peak, at least the fleet `sized` by the model for the last peak
    (_pattern_floor): one breach's ratio is capped at 2x, and a peak of many times the fleet would
    otherwise take a peak per doubling. None where no such pattern shows, or no peak of it was seen served."""
    if pattern is None or not pattern.short(context.startup_s):
        return None
    learned = history.peak_fleet(pattern, window_s)
    if learned is None:
        return None
    replicas, how = learned.replicas, learned.reason
    if not learned.any_held and sized is not None and sized[0] > replicas:
        replicas, how = sized[0], f"{how}; sized for it: {sized[1]}"
    replicas = min(max(replicas, context.spec.scaling.min_replicas), context.spec.scaling.max_replicas)
    return replicas, (f"peaks of {pattern.length_s:.0f} s recur every {pattern.period_s:.0f} s, shorter than a "
                      f"start-up ({context.startup_s:.0f} s): {replicas} replica(s) stand for the next one ({how})")


def _pattern_floor(context: ReplicaContext, history: ScalingHistory, pattern: PeakPattern | None, now_s: float,
                   shape: RequestShape, model: ReplicaModel) -> tuple[int, str] | None:
    """(replicas, why) to keep standing where demand peaks recur (`pattern`, ScalingHistory.peak_pattern): enough for
    the last peak at UNATTAINABLE_SLO_LOAD of a replica's throughput, for one period plus a start-up. The
    next peak then meets a fleet that absorbs its queue, not one that starts replicas only as it ends;
    sized by throughput, not goodput, since a peak of seconds to minutes is a transient queue the
    standing fleet drains, not a steady load. Never more than the hold window recommended."""
    if pattern is None:
        return None
    period_s = pattern.period_s
    hold_s = period_s + context.startup_s + context.decision_interval_s
    # The decisions' demands (with their queue) where this process saw them; the minutes a restart read back
    minutes = history.forecasts.day[-math.ceil(hold_s / BUCKET_S):]
    peak = max([max(d, b) for t, d, _, b in history.demands if now_s - t <= hold_s] + list(minutes))
    throughput = replica_throughput(context, shape, model)
    if peak <= 0.0 or throughput <= 0.0:
        return None
    replicas = math.ceil(peak * (1.0 + context.spec.scaling.headroom) / throughput - 1e-9)
    replicas = min(replicas, max(history.within(now_s, hold_s), default=0))
    return replicas, (f"peaks recur every {period_s:.0f} s: {replicas} replica(s) stand for the last one "
                      f"of the last {hold_s:.0f} s (one period and a start-up), {peak:.2f} req/s at {throughput:.2f} "
                      "req/s per replica")


def _stated_load_floor(context: ReplicaContext, history: ScalingHistory, pattern: PeakPattern | None,
                       model: ReplicaModel) -> tuple[int, str] | None:
    """(replicas, why) below which no scale-down goes while the arrivals history is shorter than
    spec.scaling.statedLoadFloorSeconds: the replicas planned for the stated workload, or for the busiest peak
    minute seen so far (above peak_threshold_rps) beyond its Poisson noise where that is busier, at the stated
    shape and the calibrated goodput.
    A deployment's first minutes show its load between peaks, not its peaks; sized on them, the fleet meets
    the first peak a start-up short (the 4-min surges: 1,556 of 12,915 requests missed their SLOs before the
    first surge's replicas were Ready). A peak seen states the load as much: one peak is not yet a pattern
    (PATTERN_MIN_PEAKS), and without it the fleet fell back between the first peak and the second, which then
    met it a start-up short; once a `pattern` shows, its rules size the fleet for the peaks, and only the
    statement floors. None once the history covers the window (after a restart too: the history is
    read back from Prometheus) or where nothing is stated."""
    spec = context.spec
    trusted_s = spec.scaling.stated_load_floor_seconds
    stated_rps = spec.workload.planned_requests_per_second
    seen_s = len(history.forecasts.day) * BUCKET_S
    if seen_s >= trusted_s or stated_rps <= 0.0:
        return None
    goodput = replica_goodput(context, planned_shape(spec), model)
    if goodput <= 0.0:
        return None
    # A minute's rate less its Poisson noise: a steady load's busiest minute of an hour is some two sigmas above
    # its mean, and no peak. Only a peak's minute counts (above peak_pattern's threshold): a swell of the level
    # is the load between peaks, which the rates already size; floored on its busiest minute, conv x1 held a
    # third replica for its last 17 min (10.14 GPU-h, 9.07 without).
    peak_rps = 0.0
    if pattern is None:
        minutes = history.forecasts.day
        threshold = peak_threshold_rps(minutes)
        peak_rps = max((rate - POISSON_PEAK_SIGMAS * math.sqrt(max(rate, 0.0) / BUCKET_S)
                        for rate in minutes if rate > threshold), default=0.0)
    floor_rps = max(stated_rps, peak_rps)
    replicas = min(math.ceil(floor_rps * (1.0 + spec.scaling.headroom) / goodput - 1e-9),
                   spec.scaling.max_replicas)
    load = (f"the stated workload ({stated_rps:g} req/s" if floor_rps == stated_rps else
            f"the busiest minute so far ({peak_rps:.2f} req/s beyond its noise, above the stated {stated_rps:g}")
    return replicas, (f"{load} at {goodput:.2f} req/s per replica) keeps {replicas} replica(s) until the arrivals "
                      f"history covers {trusted_s} s (it covers {seen_s:.0f} s)")


def decide(observation: Observation | None, context: ReplicaContext, history: ScalingHistory,
           now_s: float) -> ScaleDecision:
    spec = context.spec
    problem = check_observation(observation, now_s, METRICS_MAX_AGE_S)
    if problem is not None or observation is None:
        text = problem or "no metrics"
        return _hold(context, history, f"holding {context.current_replicas} replicas: {text}", text)

    shape = calibrated_shape(context, observation)
    model = calibrated_replica_model(context)  # built once: goodput and, where that is 0, throughput
    goodput = replica_goodput(context, shape, model)
    slo_attainable = goodput > 0.0
    if not slo_attainable:
        goodput = replica_throughput(context, shape, model)
    arrivals = _arrivals(observation, history)
    # Sized for now, where the fleet is saturated, by the queue's latest growth; what is remembered (the
    # forecasts, the levels bursts are held against) stays the window's, which a second's spike does not set.
    # Not while replicas start (see _saturated): one decision's growth, noisy as it is, would ask again for
    # what is already coming (as breaches do not).
    fleet = Fleet.of(context)
    arrivals_now = _arrivals(observation, history, _saturated(observation, context, fleet))
    now_sampled_s = observation.sampled_at_s
    excess = _burst_excess(observation, max(arrivals, history.level_between(now_sampled_s - observation.window_s,
                                                                             now_sampled_s)))
    # The forecasts see every decision's arrivals, and are scored at the horizon a scale-up needs now.
    forecasts = history.forecasts.with_horizon(context.startup_s + context.decision_interval_s).observe(
        observation.sampled_at_s, arrivals)
    history = replace(history, forecasts=forecasts)
    forecast = forecasts.forecast(context.forecaster)
    wanted, binding, reasons = _recommend(observation, context, fleet, goodput, history, arrivals_now, excess, shape,
                                          forecast, slo_attainable)
    history = history.with_ready(observation.sampled_at_s, context.ready_replicas, _slo_ratio(observation, spec))
    demand = arrivals + (observation.waiting_requests or 0.0) / QUEUE_DRAIN_S
    # Remembered for two windows: bursts are held where two or more fall within them.
    history = history.with_demand(observation.sampled_at_s, demand, _in_flight(observation),
                                  demand + excess if excess > 0 else 0.0,
                                  2 * spec.scaling.scale_down_stabilization_seconds)
    low, high = spec.scaling.min_replicas, spec.scaling.max_replicas
    recommended = min(max(wanted, low), high)
    if recommended != wanted:
        binding = "min-replicas" if wanted < low else "max-replicas"
        reasons.append(f"bounded to [{low}, {high}]")
    history = history.add(now_s, recommended)

    current = context.current_replicas
    desired = recommended
    pattern = history.peak_pattern(now_s)  # read once: both the floor and the short-peak fleet start from it
    pattern_floor = _pattern_floor(context, history, pattern, now_s, shape, model)
    short_peaks = _standing_for_short_peaks(context, history, pattern, observation.window_s, pattern_floor)
    if recommended > current:
        window = history.within(now_s, spec.scaling.scale_up_stabilization_seconds)
        desired = max(current, min(window))  # HPA: the lowest recommendation of the up-window
        desired = min(desired, current + max(MAX_SCALE_UP_STEP, current))
    elif recommended < current:
        patterned = held_for_statement = False
        window = history.within(now_s, spec.scaling.scale_down_stabilization_seconds)
        known_since = history.started_at_s if history.started_at_s is not None else now_s
        rise = _trend_rise(history.forecasts, arrivals)
        if now_s - known_since < spec.scaling.scale_down_stabilization_seconds:
            desired = current  # after a restart, a full window must be seen before scaling down
        elif rise is not None:
            desired = current
            reasons.append(f"no scale-down while the load rises (trend +{rise:.2f} req/s in "
                           f"{forecast.horizon_s:.0f} s)")
        else:
            if short_peaks is None and pattern_floor is None:
                # A fleet a recurring-peak rule stood lapses with the pattern through the window, as the
                # demand's recommendations do: one missed peak start must not drop it at once.
                window = window + history.stood_within(now_s, spec.scaling.scale_down_stabilization_seconds)
            desired = min(current, max(window))  # HPA: the highest recommendation of the down-window
            standing = None if short_peaks is not None else pattern_floor
            if standing is not None and standing[0] > desired:
                desired, patterned = min(current, standing[0]), True
                reasons.append(standing[1])
            stated = _stated_load_floor(context, history, pattern, model)
            if stated is not None and stated[0] > desired:
                desired, held_for_statement = min(current, stated[0]), True
                reasons.append(stated[1])
        desired = max(desired, current - max(1, math.floor(current * MAX_SCALE_DOWN_FRACTION)))
        unpaced = desired  # what binds is what holds the fleet before the pace does
        # One step per scaleDownPeriodSeconds: a fleet a burst raised leaves over minutes once the window lets
        # it, not within the minute after (on the tuning cases, spikes and surges returning within minutes).
        period_s = spec.scaling.scale_down_period_seconds
        paced_until_s = (history.last_scale_down_s if history.last_scale_down_s is not None else -math.inf) + period_s
        paced = desired < current and now_s < paced_until_s
        if paced:
            desired = current
            # Seconds from now, not a clock reading: the operator's clock is epoch seconds.
            reasons.append(f"one scale-down step per {period_s} s: the next in {paced_until_s - now_s:.0f} s")
        if desired == current and rise is not None:
            binding = "trend"
        elif patterned:
            binding = "pattern"
        elif held_for_statement and unpaced == current:
            binding = "stated-load"
        elif paced:
            binding = "pace"
        elif desired == current:
            binding = "stabilization"
            reasons.append(f"scale-down waits for the {spec.scaling.scale_down_stabilization_seconds} s window")
    if short_peaks is not None and (desired < short_peaks[0] or (current < desired and short_peaks[0] < desired)):
        # Up to the standing fleet, and no further for a peak its replicas would miss; down to it.
        desired, binding = max(short_peaks[0], min(desired, current)), "pattern"
        reasons.append(short_peaks[1])

    if binding == "pattern":
        history = history.with_standing(now_s, desired, spec.scaling.scale_down_stabilization_seconds)

    capacity_limited = False
    if desired > current and context.free_replica_slots is not None:
        room = current + context.free_replica_slots
        if desired > room:
            desired, capacity_limited, binding = max(room, current), True, "capacity"
            gpu = context.setup.gpu.name
            reasons.append(f"only {context.free_replica_slots} more replica(s) fit on free {gpu} GPUs")

    action = "scale-up" if desired > current else "scale-down" if desired < current else "hold"
    if action == "scale-down":
        history = replace(history, last_scale_down_s=now_s)
    verb = {"scale-up": "scale up", "scale-down": "scale down", "hold": "hold"}[action]
    reason = f"{verb} {current} -> {desired}: " + "; ".join(reasons)
    return ScaleDecision(desired_replicas=desired, recommended_replicas=recommended, reason=reason, action=action,
                         binding=binding, capacity_limited=capacity_limited,
                         goodput_requests_per_s=goodput if slo_attainable else 0.0, history=history, forecast=forecast)

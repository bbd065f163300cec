"""What the autoscaler sees of a deployment's live load, and whether it can be trusted."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscale.autoscaler.histogram import share_within

# Beyond these a reading is a broken exporter or query, not load.
MAX_PLAUSIBLE_LATENCY_S = 3600.0
MAX_PLAUSIBLE_REQUEST_RATE = 1e6
MAX_PLAUSIBLE_TOKENS = 1e7
# Per GPU: a thousand times any accelerator's datasheet peak.
MAX_PLAUSIBLE_FLOPS_PER_S = 1e19
MAX_PLAUSIBLE_BYTES_PER_S = 1e16
# The peak request rate is the highest rate over this long within the window: two scrapes at the
# common 15 s interval (the operator's rate() range; the simulator's two consecutive scrapes).
PEAK_RATE_INTERVAL_S = 30.0
PEAK_RATE_STEP_S = 5.0


@dataclass(frozen=True)
class BelowResolution:
    """A percentile that fell in its histogram's first bucket: it is at most `at_most` (seconds, or
    tokens for prompt lengths), and nothing more is known. Its Observation field is None."""

    signal: str  # the Observation field: ttft_s, tpot_s, prefill_quantile_s, input_tokens_quantile
    at_most: float


@dataclass(frozen=True)
class Observation:
    """One deployment's load, aggregated over its serving pods, sampled at `sampled_at_s` (epoch s).

    Rates are per second over the query window; latencies are at the SLO percentile. None means the
    series was absent (no pods scraped, or no requests finished in the window for histograms).
    """

    sampled_at_s: float
    pods_scraped: int
    request_rate: float | None  # served requests/s (finished, neither aborted nor failed)
    mean_input_tokens: float | None
    mean_output_tokens: float | None
    running_requests: float | None
    waiting_requests: float | None
    kv_cache_usage: float | None  # 0..1, mean over pods
    ttft_s: float | None  # at the SLO percentile
    tpot_s: float | None  # at the SLO percentile (inter-token latency)
    preemption_rate: float | None = None  # preemptions/s
    tpot_mean_s: float | None = None  # mean time per output token over the window (for calibration)
    # a prompt's own prefill time at the SLO percentile (vLLM's request_prefill_time_seconds): long
    # prompts set a TTFT floor that no replica count lowers
    prefill_quantile_s: float | None = None
    # finished requests/s in the busiest scrape interval of the window: bursts shorter than the window
    # that the window's mean rate flattens
    peak_request_rate: float | None = None
    window_s: float = 60.0  # the rate window: how much Poisson noise a rate carries
    # running sequences averaged over the window, summed over pods: the batch the window's TPOT was
    # decoded at (calibration), where `running_requests` is one instant's
    mean_running_requests: float | None = None
    aborted_rate: float | None = None  # requests/s the client abandoned (vLLM finished_reason abort)
    failed_rate: float | None = None  # requests/s the engine failed (finished_reason error)
    # prompt length at the SLO percentile (vLLM's request_prompt_tokens): the prompt tail where the
    # prefill-time buckets cannot resolve it
    input_tokens_quantile: float | None = None
    # percentiles the histograms could not resolve (first bucket): their fields above are None
    below_resolution: tuple[BelowResolution, ...] = ()
    # share of looked-up prompt tokens the prefix cache served (vLLM's prefix_cache_hits / _queries)
    prefix_cache_hit_rate: float | None = None
    # The engine's own estimate of the work it did, per GPU, mean over engines (vLLM >= 0.17 with
    # --enable-mfu-metrics; None when absent or zero, i.e. the flag is off), and its engine steps/s:
    # with them calibration fits achieved bandwidth and compute from work done, not from latencies alone.
    estimated_flops_per_s_per_gpu: float | None = None
    estimated_read_bytes_per_s_per_gpu: float | None = None
    estimated_write_bytes_per_s_per_gpu: float | None = None
    engine_steps_per_s: float | None = None  # per engine, mean over engines
    # mean time the window's finished requests waited for a slot (vLLM's request_queue_time_seconds): a
    # window that drained a backlog has tail latencies from an earlier, heavier load
    mean_queue_time_s: float | None = None
    # The TTFT and per-request TPOT histograms behind ttft_s and tpot_s, as (upper bound s, cumulative
    # requests/s) with a +Inf bucket; empty where absent: the share of requests within an SLO (the error
    # budget spent) is read from them, at bounds the percentile alone does not show.
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    tpot_buckets: tuple[tuple[float, float], ...] = ()

    @property
    def estimated_hbm_bytes_per_s_per_gpu(self) -> float | None:
        """Bytes read and written per second per GPU, by the engine's estimate; None unless both are known."""
        read, write = self.estimated_read_bytes_per_s_per_gpu, self.estimated_write_bytes_per_s_per_gpu
        return None if read is None or write is None else read + write

    def missed_slo_share(self, ttft_slo_s: float, tpot_slo_s: float) -> float | None:
        """The share of the window's requests that missed the TTFT or the TPOT SLO, read from their histograms
        (interpolated inside the bucket that holds each SLO): the sum of the two shares, at most 1, which counts
        a request that missed both twice (the histograms do not say which did). Past a histogram's highest
        finite bound only its +Inf bucket counts as missed. None where either histogram is absent."""
        ttft = share_within(ttft_slo_s, self.ttft_buckets)
        tpot = share_within(tpot_slo_s, self.tpot_buckets)
        if ttft is None or tpot is None:
            return None
        return min(1.0, max(0.0, 1.0 - ttft) + max(0.0, 1.0 - tpot))

    def bound_of(self, signal: str) -> float | None:
        """The upper bound known for a percentile field the histogram could not resolve, else None."""
        return next((b.at_most for b in self.below_resolution if b.signal == signal), None)


class ObservationProblem(str):
    """Why an observation cannot be used (its text goes into the MetricsUnavailable condition)."""


def _bad(value: float | None, upper: float) -> bool:
    return value is not None and (math.isnan(value) or math.isinf(value) or value < 0 or value > upper)


def check_observation(observation: Observation | None, now_s: float, max_age_s: float) -> ObservationProblem | None:
    """None when the observation is fresh and plausible; otherwise what is wrong with it."""
    if observation is None:
        return ObservationProblem("no metrics: Prometheus returned nothing for this deployment")
    age = now_s - observation.sampled_at_s
    if age > max_age_s:
        return ObservationProblem(f"metrics are stale: sampled {age:.0f} s ago (limit {max_age_s:.0f} s)")
    if observation.pods_scraped == 0:
        return ObservationProblem("no serving pod is being scraped")
    if observation.request_rate is None or observation.running_requests is None or observation.waiting_requests is None:
        return ObservationProblem("vLLM request metrics are missing (request rate, running or waiting requests)")
    checks = (
        ("request rate", observation.request_rate, MAX_PLAUSIBLE_REQUEST_RATE),
        ("peak request rate", observation.peak_request_rate, MAX_PLAUSIBLE_REQUEST_RATE),
        ("running requests", observation.running_requests, MAX_PLAUSIBLE_REQUEST_RATE),
        ("mean running requests", observation.mean_running_requests, MAX_PLAUSIBLE_REQUEST_RATE),
        ("waiting requests", observation.waiting_requests, MAX_PLAUSIBLE_REQUEST_RATE),
        ("mean input tokens", observation.mean_input_tokens, MAX_PLAUSIBLE_TOKENS),
        ("prefill time at the SLO percentile", observation.prefill_quantile_s, MAX_PLAUSIBLE_LATENCY_S),
        ("mean output tokens", observation.mean_output_tokens, MAX_PLAUSIBLE_TOKENS),
        ("KV-cache usage", observation.kv_cache_usage, 1.5),
        ("TTFT", observation.ttft_s, MAX_PLAUSIBLE_LATENCY_S),
        ("TPOT", observation.tpot_s, MAX_PLAUSIBLE_LATENCY_S),
        ("mean TPOT", observation.tpot_mean_s, MAX_PLAUSIBLE_LATENCY_S),
        ("preemption rate", observation.preemption_rate, MAX_PLAUSIBLE_REQUEST_RATE),
        ("aborted request rate", observation.aborted_rate, MAX_PLAUSIBLE_REQUEST_RATE),
        ("failed request rate", observation.failed_rate, MAX_PLAUSIBLE_REQUEST_RATE),
        ("prompt tokens at the SLO percentile", observation.input_tokens_quantile, MAX_PLAUSIBLE_TOKENS),
        ("prefix-cache hit rate", observation.prefix_cache_hit_rate, 1.0),
        ("estimated FLOP/s per GPU", observation.estimated_flops_per_s_per_gpu, MAX_PLAUSIBLE_FLOPS_PER_S),
        ("estimated bytes read/s per GPU", observation.estimated_read_bytes_per_s_per_gpu, MAX_PLAUSIBLE_BYTES_PER_S),
        ("estimated bytes written/s per GPU", observation.estimated_write_bytes_per_s_per_gpu,
         MAX_PLAUSIBLE_BYTES_PER_S),
        ("engine steps/s", observation.engine_steps_per_s, MAX_PLAUSIBLE_REQUEST_RATE),
    )
    for name, value, upper in checks:
        if _bad(value, upper):
            return ObservationProblem(f"implausible {name}: {value}")
    return None

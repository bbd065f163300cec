"""What a Prometheus scrape of the simulated fleet shows: kvscale's `Observation` over a window.

Counters and histograms are read over the last `window_s` (rate and quantiles of the requests whose
first token or completion fell in it, as `rate()` and `histogram_quantile()` over vLLM's series
would); gauges (running, waiting, KV-cache usage) are read at the sample time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvscale.autoscaler import Observation
from kvscale.autoscaler.histogram import BucketedPercentile, bucketed_percentile
from kvscale.autoscaler.signals import PEAK_RATE_INTERVAL_S, BelowResolution
from kvscale.sim.server import Replica, RequestLog

Array = NDArray[np.float64]
# vLLM's request_prefill_time_seconds buckets (its request latency buckets), for the prefill percentile.
REQUEST_LATENCY_BUCKETS_S = np.array([0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                      60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0])


# vLLM's time_to_first_token_seconds and request_time_per_output_token_seconds buckets (vllm/v1/metrics/buckets.py)
TTFT_BUCKETS_S = np.array([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                           20.0, 40.0, 80.0, 160.0, 640.0, 2560.0])
INTER_TOKEN_LATENCY_BUCKETS_S = np.array([0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                                          7.5, 10.0, 20.0, 40.0, 80.0])


# vLLM's request_prompt_tokens buckets: 1-2-5 per decade up to the model length (here past any prompt).
PROMPT_TOKEN_BUCKETS = np.array([m * 10.0 ** e for e in range(7) for m in (1, 2, 5)])


def histogram_rates(values: Array, bounds: Array, window_s: float) -> tuple[tuple[float, float], ...]:
    """`values` counted into buckets with upper `bounds` (a +Inf bucket added), as the cumulative per-second
    rates a `rate()` of vLLM's `_bucket` series over `window_s` reads; empty when there are no values."""
    if values.size == 0 or window_s <= 0.0:
        return ()
    # how many values fall at or below each bound and +Inf (Prometheus's `le` buckets)
    counts = np.cumsum(np.bincount(np.searchsorted(bounds, values, side="left"), minlength=bounds.size + 1))
    return tuple(zip([*bounds.tolist(), math.inf], (counts / window_s).tolist(), strict=True))


def histogram_percentile(quantile: float, values: Array, bounds: Array) -> BucketedPercentile | None:
    """What Prometheus reads of `values` counted into buckets with upper `bounds` (a +Inf bucket
    added), with the bucket it came from; None when there are no values."""
    # a percentile does not depend on the scale of the counts: per second over 1 s
    return bucketed_percentile(quantile, histogram_rates(values, bounds, 1.0))


@dataclass(frozen=True)
class _Bucket:
    """Events between two scrapes."""

    finished: NDArray[np.int64]
    first_tokens: NDArray[np.int64]
    preemptions: int
    running_seq_s: float  # sequences x seconds run by the scraped pods
    pod_s: float  # seconds the scraped pods were up
    prefix_queries: int = 0  # prompt tokens looked up in the prefix caches (vLLM's prefix_cache_queries)
    prefix_hits: int = 0  # and found there (prefix_cache_hits)


@dataclass(frozen=True)
class WindowStats:
    """Per-request figures of one window, beside the Observation built from them."""

    observation: Observation
    mean_prefill_s: float | None  # mean scheduled-to-first-token time


class FleetScraper:
    """Turns the request log and the serving replicas into Observations, one per scrape."""

    def __init__(self, log: RequestLog, window_s: float, scrape_interval_s: float, percentile: float) -> None:
        self.log = log
        self.window_s = window_s
        self.percentile = percentile
        self._buckets: deque[_Bucket] = deque(maxlen=max(1, round(window_s / scrape_interval_s)))
        self._finished_seen = 0
        self._first_seen = 0
        self._preemptions_seen = 0
        self._prefix_seen = (0, 0)
        self._running_seen: dict[int, float] = {}
        self._interval_s = scrape_interval_s

    def _prefix_hit_rate(self) -> float | None:
        """rate(prefix_cache_hits) / rate(prefix_cache_queries) over the window."""
        queries = sum(b.prefix_queries for b in self._buckets)
        return sum(b.prefix_hits for b in self._buckets) / queries if queries else None

    def _peak_rate(self) -> float:
        """Finished requests/s over the busiest PEAK_RATE_INTERVAL_S of the window (consecutive scrapes)."""
        span = max(1, round(PEAK_RATE_INTERVAL_S / self._interval_s))
        counts = [b.finished.size for b in self._buckets]
        sums = [sum(counts[i:i + span]) for i in range(max(1, len(counts) - span + 1))]
        return max(sums) / (min(span, len(counts)) * self._interval_s)

    def scrape(self, now_s: float, pods: Sequence[Replica]) -> WindowStats:
        log = self.log
        running_seq_s = 0.0
        for pod in pods:
            running_seq_s += pod.running_seq_s - self._running_seen.get(pod.index, 0.0)
            self._running_seen[pod.index] = pod.running_seq_s
        bucket = _Bucket(
            finished=np.array(log.finish_order[self._finished_seen:], dtype=np.int64),
            first_tokens=np.array(log.first_token_order[self._first_seen:], dtype=np.int64),
            preemptions=log.preemptions - self._preemptions_seen,
            running_seq_s=running_seq_s,
            pod_s=len(pods) * self._interval_s,
            prefix_queries=log.prefix_cache_queries - self._prefix_seen[0],
            prefix_hits=log.prefix_cache_hits - self._prefix_seen[1],
        )
        self._finished_seen = len(log.finish_order)
        self._first_seen = len(log.first_token_order)
        self._preemptions_seen = log.preemptions
        self._prefix_seen = (log.prefix_cache_queries, log.prefix_cache_hits)
        self._buckets.append(bucket)
        finished = np.concatenate([b.finished for b in self._buckets])
        first = np.concatenate([b.first_tokens for b in self._buckets])
        preemptions = sum(b.preemptions for b in self._buckets)
        pod_s = sum(b.pod_s for b in self._buckets)
        # Like Prometheus' rate(), a window with less history than its length is a rate over what it holds
        # (the first minute after start-up is not a quarter of the load).
        covered_s = min(self.window_s, len(self._buckets) * self._interval_s)
        q = self.percentile

        ttft = log.first_token_s[first] - log.arrival_s[first]
        # The engine's prefill time (vLLM's request_prefill_time_seconds) leaves out the API server's share.
        response_delay_s = pods[0].response_delay_s if pods else 0.0
        prefill = log.first_token_s[first] - log.scheduled_s[first] - response_delay_s
        outputs = log.output_tokens[finished]
        multi = finished[outputs > 1]
        decode_s = log.finish_s[multi] - log.first_token_s[multi]
        intervals = log.output_tokens[multi] - 1
        tpot = decode_s / intervals

        pods_scraped = len(pods)
        mean_running = sum(b.running_seq_s for b in self._buckets) / pod_s * len(pods) if pod_s else 0.0
        running = float(sum(len(p.running) for p in pods))
        waiting = float(sum(len(p.waiting) for p in pods))
        usage = float(np.mean([p.kv_usage for p in pods])) if pods else None
        bucketed = {"prefill_quantile_s": histogram_percentile(q / 100.0, prefill, REQUEST_LATENCY_BUCKETS_S),
                    "input_tokens_quantile": histogram_percentile(
                        q / 100.0, log.input_tokens[finished].astype(np.float64), PROMPT_TOKEN_BUCKETS)}
        observation = Observation(
            sampled_at_s=now_s,
            pods_scraped=pods_scraped,
            request_rate=finished.size / covered_s if pods else None,
            mean_input_tokens=float(np.mean(log.input_tokens[finished])) if finished.size else None,
            mean_output_tokens=float(np.mean(outputs)) if finished.size else None,
            running_requests=running if pods else None,
            mean_running_requests=mean_running if pods else None,
            waiting_requests=waiting if pods else None,
            kv_cache_usage=usage,
            ttft_s=float(np.percentile(ttft, q)) if ttft.size else None,
            tpot_s=float(np.percentile(tpot, q)) if tpot.size else None,
            preemption_rate=preemptions / covered_s if pods else None,
            prefill_quantile_s=_resolved(bucketed["prefill_quantile_s"]),
            input_tokens_quantile=_resolved(bucketed["input_tokens_quantile"]),
            below_resolution=tuple(BelowResolution(signal, read.upper) for signal, read in bucketed.items()
                                   if read is not None and not read.resolved),
            peak_request_rate=self._peak_rate() if pods else None,
            window_s=covered_s,
            # output-token-weighted mean inter-token time, as sum/count of vLLM's histogram gives it
            tpot_mean_s=float(decode_s.sum() / intervals.sum()) if intervals.size else None,
            prefix_cache_hit_rate=self._prefix_hit_rate() if log.prefix_group is not None else None,
            # vLLM observes a request's queue time when it finishes: arrival to its first scheduled step
            mean_queue_time_s=float(np.mean(log.scheduled_s[finished] - log.arrival_s[finished]))
            if finished.size else None,
            ttft_buckets=histogram_rates(ttft, TTFT_BUCKETS_S, covered_s),
            tpot_buckets=histogram_rates(tpot, INTER_TOKEN_LATENCY_BUCKETS_S, covered_s),
        )
        return WindowStats(
            observation=observation,
            mean_prefill_s=float(np.mean(prefill)) if prefill.size else None,
        )


def _resolved(read: BucketedPercentile | None) -> float | None:
    return read.value if read is not None and read.resolved else None

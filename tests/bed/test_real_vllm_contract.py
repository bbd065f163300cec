"""The contract with a real vLLM: captured `/metrics` of vLLM 0.32 (CPU build) replayed to the bed's
real Prometheus; every Observation field must equal what the raw counters say.

The capture (tests/bed/fixtures/vllm-real/capture.jsonl.gz, from `make test-vllm`, see
tests/realvllm/README.md) is real vLLM output under load: 4 clients, then 1, with some requests
aborted by their client. tests/testbed/metricsreplay.py serves it with its own timestamps, twice: as
one pod with one engine, and as one pod with two data-parallel engines. The expected values are
computed here from the snapshots with Prometheus 2.x's own rules (extrapolated rate, closed ranges,
subquery alignment), independently of kvscale's PromQL. Each of the five defects a real vLLM showed
(issue 18) is checked to matter on this data, so undoing a fix fails this test. The capture was taken
with --enable-mfu-metrics and prefix caching on (issue 13): the prefix-cache hit rate, the engine's
per-GPU work counters (averaged over engines, not summed) and its steps/s are compared too.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from bedkit import Prometheus, wait_until
from metricsreplay import MetricsReplay, Snapshot, read_capture
from prometheus_client.parser import text_string_to_metric_families

from kvscale.autoscaler.histogram import bucketed_percentile
from kvscale.autoscaler.signals import PEAK_RATE_INTERVAL_S, PEAK_RATE_STEP_S, Observation
from kvscale.metrics import DeploymentKey, PrometheusSource
from kvscale.metrics.queries import GAUGE_SMOOTHING_S

CAPTURE = Path(__file__).resolve().parent / "fixtures" / "vllm-real" / "capture.jsonl.gz"
NAMESPACE = "vllm-contract"
WINDOW_S = 40
# The capture's snapshots are >= 2 s apart and the bed scrapes every 2 s: stretched by 1.5, each lasts
# past a scrape, so Prometheus stores every one (rates read 1/1.5 of the captured ones; the expected
# values are computed on the same stretched clock).
TIME_SCALE = 1.5
QUANTILE = 0.95
LOOKBACK_S = 300.0  # Prometheus's instant-vector lookback
UNSERVED = {"abort", "error"}
INFERENCE = {"/v1/completions", "/v1/chat/completions", "/v1/responses"}

Labels = frozenset[tuple[str, str]]
Series = dict[tuple[str, Labels], list[tuple[float, float]]]


def _series(replay: MetricsReplay) -> Series:
    """Every sample of every series as Prometheus stored it: (name, labels) -> [(time s, value)]."""
    series: Series = defaultdict(list)
    for snapshot in replay.snapshots:
        at_s = round(replay.at(snapshot) * 1000) / 1000.0
        for engine in range(replay.engines):
            for family in text_string_to_metric_families(snapshot.text):
                for sample in family.samples:
                    labels = dict(sample.labels)
                    if "engine" in labels:
                        labels["engine"] = str(engine) if labels["engine"] == "0" else labels["engine"]
                    elif engine:
                        continue  # a series without an engine label is not repeated
                    series[(sample.name, frozenset(labels.items()))].append((at_s, float(sample.value)))
    return series


def _in_range(samples: list[tuple[float, float]], start_s: float, end_s: float) -> list[tuple[float, float]]:
    return [(t, v) for t, v in samples if start_s <= t <= end_s]  # Prometheus 2.x: a closed range


def _extrapolated_rate(samples: list[tuple[float, float]], at_s: float, range_s: float) -> float | None:
    """promql/functions.go extrapolatedRate (2.x) for a counter: increase over the range, extrapolated
    towards its edges by at most half a sample interval, per second."""
    points = _in_range(samples, at_s - range_s, at_s)
    if len(points) < 2:
        return None
    increase, previous = points[-1][1] - points[0][1], points[0][1]
    for _t, value in points[1:]:
        if value < previous:
            increase += previous  # a counter reset
        previous = value
    sampled = points[-1][0] - points[0][0]
    to_start, to_end = points[0][0] - (at_s - range_s), at_s - points[-1][0]
    average = sampled / (len(points) - 1)
    if increase > 0 and points[0][1] >= 0:
        to_start = min(to_start, sampled * (points[0][1] / increase))
    threshold = average * 1.1
    extrapolate_to = sampled + (to_start if to_start < threshold else average / 2)
    extrapolate_to += to_end if to_end < threshold else average / 2
    return increase * (extrapolate_to / sampled) / range_s


@dataclass
class Raw:
    """The stored series, queried the way kvscale's PromQL means it."""

    series: Series

    def select(self, name: str, where: Callable[[dict[str, str]], bool] = lambda _labels: True
               ) -> Iterable[tuple[dict[str, str], list[tuple[float, float]]]]:
        for (series_name, labels), samples in self.series.items():
            if series_name == name and where(dict(labels)):
                yield dict(labels), samples

    def sum_rate(self, name: str, at_s: float, range_s: float,
                 where: Callable[[dict[str, str]], bool] = lambda _labels: True) -> float | None:
        rates = [_extrapolated_rate(samples, at_s, range_s) for _l, samples in self.select(name, where)]
        known = [r for r in rates if r is not None]
        return sum(known) if known else None

    def mean_rate(self, name: str, at_s: float, range_s: float) -> float | None:
        """avg by (deployment) (rate(...)): the mean over the series (one per engine)."""
        rates = [_extrapolated_rate(samples, at_s, range_s) for _l, samples in self.select(name)]
        known = [r for r in rates if r is not None]
        return sum(known) / len(known) if known else None

    def sum_avg_over_time(self, name: str, at_s: float, range_s: float) -> float | None:
        means = [sum(v for _t, v in points) / len(points) for _l, samples in self.select(name)
                 if (points := _in_range(samples, at_s - range_s, at_s))]
        return sum(means) if means else None

    def instant(self, name: str, at_s: float) -> list[tuple[float, float]]:
        """The latest sample of each series at or before `at_s`, within the lookback."""
        latest = []
        for _l, samples in self.select(name):
            points = _in_range(samples, at_s - LOOKBACK_S, at_s)
            if points:
                latest.append(points[-1])
        return latest

    def buckets(self, name: str, at_s: float) -> tuple[tuple[float, float], ...]:
        """sum by (le) (rate(name_bucket[window])): (upper bound, cumulative rate) by bound."""
        by_le: dict[float, float] = defaultdict(float)
        for labels, samples in self.select(f"{name}_bucket"):
            rate = _extrapolated_rate(samples, at_s, WINDOW_S)
            if rate is not None:
                by_le[float(labels["le"])] += rate
        return tuple(sorted(by_le.items()))

    def percentile(self, name: str, at_s: float) -> tuple[float | None, float | None]:
        """(resolved percentile, bound when it fell in the first bucket) of a histogram's bucket rates."""
        read = bucketed_percentile(QUANTILE, self.buckets(name, at_s))
        if read is None:
            return None, None
        return (read.value, None) if read.resolved else (None, read.upper)

    def ratio(self, numerator: str, denominator: str, at_s: float) -> float | None:
        top, bottom = self.sum_rate(numerator, at_s, WINDOW_S), self.sum_rate(denominator, at_s, WINDOW_S)
        return None if top is None or not bottom else top / bottom


def _reason(labels: dict[str, str]) -> str:
    return labels.get("finished_reason", "")


def _peak_rate(raw: Raw, at_s: float) -> float | None:
    """max_over_time((sum(rate(served[30s])))[window:5s]): subquery points at multiples of the step."""
    step_ms, start_ms = round(PEAK_RATE_STEP_S * 1000), round((at_s - WINDOW_S) * 1000)
    first_ms = step_ms * (start_ms // step_ms) + (step_ms if start_ms % step_ms else 0)
    rates = [raw.sum_rate("vllm:request_success_total", point_ms / 1000.0, PEAK_RATE_INTERVAL_S,
                          lambda labels: _reason(labels) not in UNSERVED)
             for point_ms in range(first_ms, round(at_s * 1000) + 1, step_ms)]
    known = [r for r in rates if r is not None]
    return max(known) if known else None


def _larger(first: float | None, second: float | None) -> float | None:
    known = [value for value in (first, second) if value is not None]
    return max(known) if known else None


def _aborted_rate(raw: Raw, at_s: float) -> float | None:
    """Engine aborts, plus completions answered 2xx beyond the finished requests (vLLM 0.32 records no
    finished request for a client that disconnects; its HTTP layer still counts the response)."""
    engine = raw.sum_rate("vllm:request_success_total", at_s, WINDOW_S, lambda labels: _reason(labels) == "abort")
    answered = raw.sum_rate("http_requests_total", at_s, WINDOW_S,
                            lambda labels: labels.get("handler") in INFERENCE and labels.get("status") == "2xx")
    finished = raw.sum_rate("vllm:request_success_total", at_s, WINDOW_S)
    if answered is None or finished is None or engine is None:
        return engine
    return max(answered - finished, 0.0) + engine


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def _hit_rate(raw: Raw, at_s: float) -> float | None:
    """Prompt tokens served from the prefix cache over those looked up; none where none were."""
    queries = raw.sum_rate("vllm:prefix_cache_queries_total", at_s, WINDOW_S)
    hits = raw.sum_rate("vllm:prefix_cache_hits_total", at_s, WINDOW_S)
    if hits is None or not queries:
        return None
    return min(max(hits / queries, 0.0), 1.0)


def expected_observation(raw: Raw, at_s: float) -> dict[str, object]:
    running_now = raw.instant("vllm:num_requests_running", at_s)
    percentiles = {field: raw.percentile(metric, at_s) for field, metric in (
        ("ttft_s", "vllm:time_to_first_token_seconds"),
        ("tpot_s", "vllm:request_time_per_output_token_seconds"),
        ("prefill_quantile_s", "vllm:request_prefill_time_seconds"),
        ("input_tokens_quantile", "vllm:request_prompt_tokens"))}
    kv_means = [sum(v for _t, v in points) / len(points) for _l, samples in raw.select("vllm:kv_cache_usage_perc")
                if (points := _in_range(samples, at_s - GAUGE_SMOOTHING_S, at_s))]
    return {
        "sampled_at_s": max(t for t, _v in running_now),
        "pods_scraped": 1,
        "request_rate": raw.sum_rate("vllm:request_success_total", at_s, WINDOW_S,
                                     lambda labels: _reason(labels) not in UNSERVED),
        "aborted_rate": _aborted_rate(raw, at_s),
        "failed_rate": raw.sum_rate("vllm:request_success_total", at_s, WINDOW_S,
                                    lambda labels: _reason(labels) == "error"),
        "peak_request_rate": _peak_rate(raw, at_s),
        "mean_input_tokens": raw.ratio("vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_count", at_s),
        "mean_output_tokens": raw.ratio("vllm:request_generation_tokens_sum", "vllm:request_generation_tokens_count",
                                        at_s),
        # at least Little's law: the time finished requests spent running (waiting), per second
        "running_requests": _larger(raw.sum_avg_over_time("vllm:num_requests_running", at_s, GAUGE_SMOOTHING_S),
                                    raw.sum_rate("vllm:request_inference_time_seconds_sum", at_s, GAUGE_SMOOTHING_S)),
        "mean_running_requests": _larger(raw.sum_avg_over_time("vllm:num_requests_running", at_s, WINDOW_S),
                                         raw.sum_rate("vllm:request_inference_time_seconds_sum", at_s, WINDOW_S)),
        "waiting_requests": _larger(sum(v for _t, v in raw.instant("vllm:num_requests_waiting", at_s)),
                                    raw.sum_rate("vllm:request_queue_time_seconds_sum", at_s, GAUGE_SMOOTHING_S)),
        "kv_cache_usage": sum(kv_means) / len(kv_means),
        "preemption_rate": raw.sum_rate("vllm:num_preemptions_total", at_s, WINDOW_S),
        "tpot_mean_s": raw.ratio("vllm:request_time_per_output_token_seconds_sum",
                                 "vllm:request_time_per_output_token_seconds_count", at_s),
        "mean_queue_time_s": raw.ratio("vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count",
                                       at_s),
        **{field: value for field, (value, _bound) in percentiles.items()},
        "below_resolution": sorted((field, bound) for field, (_value, bound) in percentiles.items()
                                   if bound is not None),
        "prefix_cache_hit_rate": _hit_rate(raw, at_s),
        # the histograms the SLO shares are read from (Observation.missed_slo_share)
        "ttft_buckets": raw.buckets("vllm:time_to_first_token_seconds", at_s),
        "tpot_buckets": raw.buckets("vllm:request_time_per_output_token_seconds", at_s),
        # --enable-mfu-metrics: per-GPU counters, one series per engine
        "estimated_flops_per_s_per_gpu": _positive(raw.mean_rate("vllm:estimated_flops_per_gpu_total", at_s,
                                                                 WINDOW_S)),
        "estimated_read_bytes_per_s_per_gpu": _positive(raw.mean_rate("vllm:estimated_read_bytes_per_gpu_total",
                                                                      at_s, WINDOW_S)),
        "estimated_write_bytes_per_s_per_gpu": _positive(raw.mean_rate("vllm:estimated_write_bytes_per_gpu_total",
                                                                       at_s, WINDOW_S)),
        "engine_steps_per_s": _positive(raw.mean_rate("vllm:iteration_tokens_total_count", at_s, WINDOW_S)),
        # what the five defects would have read instead
        "all_finished_rate": raw.sum_rate("vllm:request_success_total", at_s, WINDOW_S),
        "running_one_scrape": sum(v for _t, v in running_now),
        "engine_series": len(running_now),
        "flops_summed_over_engines": raw.sum_rate("vllm:estimated_flops_per_gpu_total", at_s, WINDOW_S),
    }


def _close(seen: object, want: object) -> bool:
    if isinstance(seen, tuple) and isinstance(want, tuple):
        return len(seen) == len(want) and all(_close(a, b) for a, b in zip(seen, want, strict=True))
    if isinstance(seen, float | int) and isinstance(want, float | int):
        return math.isclose(seen, want, rel_tol=1e-6, abs_tol=1e-9)
    return seen == want


@pytest.fixture(scope="module")
def capture() -> list[Snapshot]:
    if not CAPTURE.exists():
        pytest.fail(f"{CAPTURE} is missing: `make test-vllm` captures it from a real vLLM")
    return read_capture(CAPTURE)


def test_every_observation_field_equals_the_raw_counters_of_a_real_vllm(
        prometheus: Prometheus, capture: list[Snapshot]) -> None:
    replays = {"single": MetricsReplay(capture, engines=1, time_scale=TIME_SCALE),
               "dual": MetricsReplay(capture, engines=2, time_scale=TIME_SCALE)}
    with replays["single"], replays["dual"]:
        for name, replay in replays.items():
            prometheus.add_target(f"vllm-contract-{name}", replay.host_port,
                                  {"namespace": NAMESPACE, "llmdeployment": name, "pod": f"{name}-0"})
        try:
            # Scraped already (an empty body) before the first snapshot is due, so none is missed.
            for replay in replays.values():
                prometheus.wait_for_target_up(replay.host_port, timeout=60)
            start_s = time.time() + 1.0
            for replay in replays.values():
                replay.begin(start_s)
            end_s = max(r.end_s for r in replays.values())
            wait_until(lambda: time.time() > end_s + 3, end_s - time.time() + 60, "the whole capture to be replayed")
            # The premise of every comparison below: Prometheus stored every snapshot, at its own time.
            stored = prometheus.query(f'count_over_time(vllm:num_requests_running{{namespace="{NAMESPACE}"}}[1h])')
            assert sorted(int(float(r["value"][1])) for r in stored) == [len(capture)] * 3, stored
            source = PrometheusSource(prometheus.url, window_s=WINDOW_S)
            evaluated = _evaluation_times(replays["single"])
            seen_defects: dict[str, int] = defaultdict(int)
            for name, replay in replays.items():
                raw = Raw(_series(replay))
                key = DeploymentKey(NAMESPACE, name)
                for at_s in evaluated:
                    observation = source.fetch([key], QUANTILE, at_s=at_s).observations.get(key)
                    assert observation is not None, f"{name} at {at_s - start_s:.1f} s: no observation"
                    want = expected_observation(raw, at_s)
                    _assert_fields(observation, want, f"{name} at +{at_s - start_s:.1f} s")
                    seen_defects.update(_defects_that_matter(observation, want))
            # The capture exercises every fix: undo one and the comparison above fails somewhere.
            for defect in ("aborted requests read apart from served ones", "engine series counted as pods",
                           "one scrape of a gauge", "a first-bucket percentile read as a value",
                           "per-GPU work counted once per engine", "prefix-cache hit rate read",
                           "engine work counters read"):
                assert seen_defects[defect] > 0, (defect, dict(seen_defects))
        finally:
            for name in replays:
                prometheus.remove_target(f"vllm-contract-{name}")


def _evaluation_times(replay: MetricsReplay) -> list[float]:
    """Instants a quarter second after every third snapshot that has a full window behind it."""
    assert replay.start_s is not None
    first = replay.start_s + WINDOW_S + 2
    # whole milliseconds: the source sends the time as %.3f, and Prometheus keeps milliseconds
    times = [round(replay.at(s) + 0.25, 3) for s in replay.snapshots if replay.at(s) >= first]
    return times[::3]


def _assert_fields(observation: Observation, want: dict[str, object], where: str) -> None:
    for field in Observation.__dataclass_fields__:
        if field == "window_s":
            assert observation.window_s == WINDOW_S
            continue
        seen = getattr(observation, field)
        if field == "below_resolution":
            seen = sorted((b.signal, b.at_most) for b in seen)
        expected = want[field]
        assert _close(seen, expected), f"{where}: {field} is {seen}, the raw counters say {expected}"


def _defects_that_matter(observation: Observation, want: dict[str, object]) -> dict[str, int]:
    """Which of the five defects would have shown in this observation, and whether the issue-13 series
    (prefix cache, engine work counters) were read."""
    found: dict[str, int] = defaultdict(int)
    if not _close(want["all_finished_rate"], observation.request_rate):
        found["engine aborts or errors counted as served"] += 1
    if (observation.aborted_rate or 0.0) > 0.0:
        found["aborted requests read apart from served ones"] += 1
    if want["engine_series"] != observation.pods_scraped:
        found["engine series counted as pods"] += 1
    if not _close(want["running_one_scrape"], observation.running_requests):
        found["one scrape of a gauge"] += 1
    if observation.below_resolution:
        found["a first-bucket percentile read as a value"] += 1
    flops = observation.estimated_flops_per_s_per_gpu
    if flops is not None and not _close(want["flops_summed_over_engines"], flops):
        found["per-GPU work counted once per engine"] += 1
    # the capture's prompts are random: the cache is queried and never hits, which reads 0, not unknown
    if observation.prefix_cache_hit_rate is not None:
        found["prefix-cache hit rate read"] += 1
    if None not in (flops, observation.estimated_hbm_bytes_per_s_per_gpu, observation.engine_steps_per_s):
        found["engine work counters read"] += 1
    return found

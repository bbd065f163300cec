"""Fetching: run each query once per cycle and assemble one Observation per deployment."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.exceptions import RequestException

from kvscale.autoscaler.histogram import bucketed_percentile
from kvscale.autoscaler.signals import BelowResolution, Observation
from kvscale.errors import KvscaleError
from kvscale.metrics.queries import (
    DEFAULT_WINDOW_S,
    DeploymentKey,
    MetricsLabels,
    build_arrivals_query,
    build_bucket_queries,
    build_in_flight_by_pod_query,
    build_queries,
)

QUERY_TIMEOUT_S = 10
# The HTTP deadline, a little beyond Prometheus's own query timeout: a server that accepts the
# connection and never answers must fail the fetch, not hang the operator's resync loop.
HTTP_TIMEOUT_S = QUERY_TIMEOUT_S + 5


class MetricsUnavailableError(KvscaleError):
    """Prometheus could not be queried at all (down, unreachable, or an error for every query)."""


@dataclass(frozen=True)
class FetchResult:
    """Observations by deployment, plus the mean prefill time (for calibration) where known."""

    observations: Mapping[DeploymentKey, Observation]
    prefill_s: Mapping[DeploymentKey, float]


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number


class PrometheusSource:
    """Reads vLLM / SGLang metrics for many LLMDeployments with one query per signal."""

    def __init__(self, url: str, labels: MetricsLabels | None = None, window_s: int = DEFAULT_WINDOW_S) -> None:
        self.url = url
        self.labels = labels or MetricsLabels()
        self.window_s = window_s
        self._client = PrometheusConnect(url=url, disable_ssl=True, timeout=HTTP_TIMEOUT_S)

    def _rows(self, promql: str, at_s: float | None) -> list[dict[str, Any]]:
        """The result vector of one instant query, checked for the shape the HTTP API promises."""
        params = {"timeout": f"{QUERY_TIMEOUT_S}s"}
        if at_s is not None:
            params["time"] = f"{at_s:.3f}"
        try:
            rows = self._client.custom_query(query=promql, params=params)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not JSON, or JSON without data.result
            raise MetricsUnavailableError(f"Prometheus at {self.url} sent a malformed reply to {promql!r}: "
                                          f"{type(exc).__name__}: {exc}") from exc
        except (PrometheusApiClientException, RequestException, OSError) as exc:
            raise MetricsUnavailableError(f"Prometheus at {self.url} failed: {exc}") from exc
        if not isinstance(rows, list) or not all(_is_sample(row) for row in rows):
            raise MetricsUnavailableError(f"Prometheus at {self.url} sent a malformed reply to {promql!r}: "
                                          f"expected a vector of samples, got {str(rows)[:200]}")
        return rows

    def arrivals_history(self, keys: Iterable[DeploymentKey], lookback_s: float, step_s: float,
                         end_s: float | None = None, rate_window_s: float | None = None,
                         ) -> dict[DeploymentKey, list[tuple[float, float]]]:
        """(epoch s, served requests/s over `rate_window_s`, default `step_s`) per deployment, one point
        per `step_s` over the last `lookback_s` (a range query): what a restarted operator seeds its
        forecasts with."""
        wanted = set(keys)
        end_s = self._evaluation_time_s() if end_s is None else end_s
        if end_s is None or not wanted:
            return {}
        promql = build_arrivals_query(self.labels, int(rate_window_s or step_s))
        try:
            rows = self._client.custom_query_range(
                query=promql, start_time=datetime.fromtimestamp(end_s - lookback_s, UTC),
                end_time=datetime.fromtimestamp(end_s, UTC), step=f"{step_s:g}",
                params={"timeout": f"{QUERY_TIMEOUT_S}s"})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MetricsUnavailableError(f"Prometheus at {self.url} sent a malformed reply to {promql!r}: "
                                          f"{type(exc).__name__}: {exc}") from exc
        except (PrometheusApiClientException, RequestException, OSError) as exc:
            raise MetricsUnavailableError(f"Prometheus at {self.url} failed: {exc}") from exc
        if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("values"), list)
                                                 for r in rows):
            raise MetricsUnavailableError(f"Prometheus at {self.url} sent a malformed reply to {promql!r}: "
                                          f"expected a matrix, got {str(rows)[:200]}")
        history: dict[DeploymentKey, list[tuple[float, float]]] = {}
        for row in rows:
            metric = row.get("metric") or {}
            key = DeploymentKey(str(metric.get(self.labels.namespace)), str(metric.get(self.labels.deployment)))
            if key not in wanted:
                continue
            points = []
            for point in row["values"]:
                t, value = (_number(point[0]), _number(point[1])) if isinstance(point, list) and len(point) == 2 \
                    else (None, None)
                if t is not None and value is not None and value >= 0:
                    points.append((t, value))
            history[key] = sorted(points)
        return history

    def in_flight_by_pod(self, keys: Iterable[DeploymentKey]) -> dict[DeploymentKey, dict[str, float]]:
        """Requests running plus waiting per pod name, per deployment (those with series only)."""
        wanted = set(keys)
        loads: dict[DeploymentKey, dict[str, float]] = {}
        if not wanted:
            return loads
        for key, labels, value in self._samples(build_in_flight_by_pod_query(self.labels), None):
            pod = labels.get(self.labels.pod)
            if key in wanted and pod and math.isfinite(value):
                loads.setdefault(key, {})[str(pod)] = max(value, 0.0)
        return loads

    def _evaluation_time_s(self) -> float | None:
        """Prometheus's own clock: every query of one fetch is evaluated at this instant.

        Sequential queries at "now" would each see a slightly different window, so a request rate
        could count a request whose TTFT the next query no longer sees. The server's clock, not
        ours, so that clock skew never shifts the windows.
        """
        rows = self._rows("vector(time())", None)
        return _number((rows[0].get("value") or [None, None])[1]) if rows else None

    def _samples(self, promql: str, at_s: float | None) -> list[tuple[DeploymentKey, dict[str, Any], float]]:
        """(deployment, labels, value) of every sample that names a deployment and holds a number."""
        samples = []
        for row in self._rows(promql, at_s):
            metric = row.get("metric", {})
            namespace, name = metric.get(self.labels.namespace), metric.get(self.labels.deployment)
            value = _number((row.get("value") or [None, None])[1])
            if namespace and name and value is not None:
                samples.append((DeploymentKey(namespace, name), metric, value))
        return samples

    def _query(self, promql: str, at_s: float | None) -> dict[DeploymentKey, float]:
        return {key: value for key, _labels, value in self._samples(promql, at_s)}

    def _query_buckets(self, promql: str, at_s: float | None) -> dict[DeploymentKey, list[tuple[float, float]]]:
        """(upper bound, cumulative rate) per deployment, from a `sum by (..., le)` of bucket rates."""
        buckets: dict[DeploymentKey, list[tuple[float, float]]] = {}
        for key, labels, value in self._samples(promql, at_s):
            bound = _number(labels.get("le"))
            if bound is not None:
                buckets.setdefault(key, []).append((bound, value))
        return buckets

    def fetch(self, keys: Iterable[DeploymentKey], quantile: float, at_s: float | None = None) -> FetchResult:
        """Observations for `keys` at one SLO quantile; a deployment with no series gets none.
        `at_s` evaluates at that instant (epoch s) instead of Prometheus's now."""
        wanted = set(keys)
        at_s = self._evaluation_time_s() if at_s is None else at_s
        columns = {field: self._query(promql, at_s) for field, promql in
                   build_queries(self.labels, self.window_s).items()}
        histograms = {field: self._query_buckets(promql, at_s) for field, promql in
                      build_bucket_queries(self.labels, self.window_s).items()}
        observations: dict[DeploymentKey, Observation] = {}
        prefill: dict[DeploymentKey, float] = {}
        for key in wanted:
            sampled = columns["sampled_at_s"].get(key)
            if sampled is None:
                continue  # no series at all: the policy sees "no metrics"

            def get(field: str, key: DeploymentKey = key) -> float | None:
                value = columns[field].get(key)
                # histogram_quantile over an empty window is NaN: "no requests finished", not broken
                return None if value is None or (math.isnan(value) and field.endswith("_s")) else value

            percentiles: dict[str, float | None] = {}
            below: list[BelowResolution] = []
            for field, by_key in histograms.items():
                read = bucketed_percentile(quantile, by_key.get(key, ()))
                if read is not None and not read.resolved:
                    below.append(BelowResolution(field, read.upper))
                percentiles[field] = read.value if read is not None and read.resolved else None

            observations[key] = Observation(
                sampled_at_s=sampled, window_s=float(self.window_s),
                pods_scraped=int(get("pods_scraped") or 0),
                request_rate=get("request_rate"),
                mean_input_tokens=_finite(get("mean_input_tokens")),
                mean_output_tokens=_finite(get("mean_output_tokens")),
                running_requests=get("running_requests"),
                mean_running_requests=get("mean_running_requests"),
                waiting_requests=get("waiting_requests"),
                kv_cache_usage=get("kv_cache_usage"),
                ttft_s=percentiles["ttft_s"],
                tpot_s=percentiles["tpot_s"],
                preemption_rate=get("preemption_rate"),
                tpot_mean_s=_finite(get("tpot_mean_s")),
                prefill_quantile_s=percentiles["prefill_quantile_s"],
                peak_request_rate=_finite(get("peak_request_rate")),
                aborted_rate=get("aborted_rate"),
                failed_rate=get("failed_rate"),
                input_tokens_quantile=percentiles["input_tokens_quantile"],
                below_resolution=tuple(below),
                prefix_cache_hit_rate=_share(_finite(get("prefix_cache_hit_rate"))),
                estimated_flops_per_s_per_gpu=_positive(get("estimated_flops_per_s_per_gpu")),
                estimated_read_bytes_per_s_per_gpu=_positive(get("estimated_read_bytes_per_s_per_gpu")),
                estimated_write_bytes_per_s_per_gpu=_positive(get("estimated_write_bytes_per_s_per_gpu")),
                engine_steps_per_s=_positive(get("engine_steps_per_s")),
                mean_queue_time_s=_finite(get("mean_queue_time_s")),
                ttft_buckets=_ordered(histograms["ttft_s"].get(key, ())),
                tpot_buckets=_ordered(histograms["tpot_s"].get(key, ())),
            )
            prefill_value = _finite(get("prefill_s"))
            if prefill_value is not None:
                prefill[key] = prefill_value
        return FetchResult(observations=observations, prefill_s=prefill)


def _ordered(buckets: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """A histogram's (upper bound, cumulative rate) pairs by bound, NaN rates (no samples in range) left out."""
    return tuple(sorted((bound, rate) for bound, rate in buckets if not math.isnan(rate)))


def _is_sample(row: Any) -> bool:
    """One element of an instant vector: {"metric": {label: value}, "value": [time, "number"]}."""
    if not isinstance(row, dict) or not isinstance(row.get("metric", {}), dict):
        return False
    value = row.get("value")
    return isinstance(value, list | tuple) and len(value) == 2


def _finite(value: float | None) -> float | None:
    """Means over an idle window are 0/0: treat as unknown."""
    return value if value is not None and math.isfinite(value) else None


def _positive(value: float | None) -> float | None:
    """A rate of work that reads 0 says nothing: vLLM exports the MFU counters at 0 without
    --enable-mfu-metrics, and an idle window did no work to measure."""
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _share(value: float | None) -> float | None:
    """A ratio of two counters' rates, each extrapolated to the window's edges on its own, can land a
    hair outside 0..1: it is a share, so it is clamped."""
    return None if value is None else min(max(value, 0.0), 1.0)

"""PromQL for every signal the autoscaler uses, one query per signal for all deployments at once.

Series are grouped by the target labels that name a deployment (`namespace`, `llmdeployment` by
default: relabel the pod label `kvscale.dev/llmdeployment` to `llmdeployment` in the scrape config).
vLLM's current names come first, with `or` fallbacks to renamed ones (`gpu_cache_usage_perc`,
`time_per_output_token_seconds`) and to SGLang's. SGLang exports one series per TP rank, so its gauges
are reduced per pod with `max` before summing over pods; vLLM exports one series per data-parallel
engine (label `engine`), so pods are counted as pods, not series.

What a real vLLM showed that a simulator hides:
* finished requests carry `finished_reason` stop, length, abort, error (and repetition): only the
  ones served count as served demand; aborted and failed ones are read separately (a client that
  disconnects is not counted there at all: see `_client_aborts`).
* gauges are one instant, taken at an engine step: a real vLLM 0.32 with 4 busy clients read
  `num_requests_running` 0 in 32 of 40 scrapes. Gauges are averaged over the last GAUGE_SMOOTHING_S,
  and requests running (waiting) are at least what Little's law gives from the time finished requests
  spent running (waiting) per second (`rate(vllm:request_inference_time_seconds_sum)`), a counter no
  scrape can miss.
* percentiles are read as buckets, not through histogram_quantile: the caller must know when the
  percentile fell in the first bucket (vLLM's prefill buckets start at 0.3 s, its TPOT ones at 10 ms),
  where the interpolated figure is a fraction of the bound, not a measurement.
* the engine's work counters (vllm:estimated_*_per_gpu_total, vLLM >= 0.17 with --enable-mfu-metrics)
  are already per GPU, one series per engine: they are averaged over engines, never summed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscale.autoscaler.signals import PEAK_RATE_INTERVAL_S, PEAK_RATE_STEP_S

# The rate window of every query (`kvscale run --metrics-window`): four scrapes at the common 15 s interval. A
# rate over fewer than a few scrapes is mostly one scrape's noise, hence the least the operator takes.
DEFAULT_WINDOW_S = 60
MIN_WINDOW_S = 10
# Gauges are averaged over this long (two scrapes at the common 15 s interval, 15 at the bed's 2 s).
GAUGE_SMOOTHING_S = 30
# vLLM's finished_reason values for requests that were not served (llm-d-inference-sim spells the label
# finish_reason): they are not served demand.
FINISH_REASON_LABELS = ("finished_reason", "finish_reason")
SERVED = ",".join(f'{label}!~"abort|error"' for label in FINISH_REASON_LABELS)
# The OpenAI-compatible handlers whose requests reach the engine (prometheus-fastapi-instrumentator's label).
INFERENCE_HANDLERS = "/v1/completions|/v1/chat/completions|/v1/responses"


@dataclass(frozen=True)
class MetricsLabels:
    """Target label names that identify an LLMDeployment's pods in Prometheus."""

    namespace: str = "namespace"
    deployment: str = "llmdeployment"
    pod: str = "pod"

    @property
    def group(self) -> str:
        return f"{self.namespace}, {self.deployment}"


@dataclass(frozen=True, order=True)
class DeploymentKey:
    namespace: str
    name: str


def _sum_rate(metric: str, labels: MetricsLabels, window: str) -> str:
    return f"sum by ({labels.group}) (rate({metric}[{window}]))"


def _per_pod_gauge(metric: str, labels: MetricsLabels, reduce: str = "sum") -> str:
    # max over a pod's series (SGLang: one per TP rank; vLLM: one per DP engine is summed instead)
    return f"{reduce} by ({labels.group}) (max by ({labels.group}, {labels.pod}) ({metric}))"


def _mean_of_histogram(metric: str, labels: MetricsLabels, window: str) -> str:
    return f"{_sum_rate(metric + '_sum', labels, window)} / {_sum_rate(metric + '_count', labels, window)}"


def _buckets(labels: MetricsLabels, window: str, *metrics: str) -> str:
    """Bucket rates (cumulative, by `le`) of the first histogram a deployment exports. The fallbacks are
    per deployment (`unless on`), never per bucket: two families' buckets must not mix."""
    families = [f"sum by ({labels.group}, le) (rate({metric}_bucket[{window}]))" for metric in metrics]
    parts = [f"({families[0]})"]
    for index in range(1, len(families)):
        earlier = " or ".join(f"({family})" for family in families[:index])
        parts.append(f"(({families[index]}) unless on ({labels.group}) ({earlier}))")
    return " or ".join(parts)


def _unserved(reason: str, labels: MetricsLabels, window: str) -> list[str]:
    return [_sum_rate(f'vllm:request_success_total{{{label}="{reason}"}}', labels, window)
            for label in FINISH_REASON_LABELS]


def _client_aborts(labels: MetricsLabels, window: str) -> str:
    """Requests/s abandoned by their clients, as vLLM 0.32 shows them: a client that disconnects is
    aborted by the API server without a finished-request record (output_processor.abort_requests), so
    finished_reason="abort" counts only the engine's own aborts. Its HTTP layer still counts the
    response: completions answered 2xx beyond the requests that finished are the abandoned ones."""
    answered = _sum_rate(f'http_requests_total{{handler=~"{INFERENCE_HANDLERS}",status="2xx"}}', labels, window)
    finished = _sum_rate("vllm:request_success_total", labels, window)
    engine_aborts = _sum_rate('vllm:request_success_total{finished_reason="abort"}', labels, window)
    return f"clamp_min({answered} - {finished}, 0) + {engine_aborts}"


def _larger(first: str, second: str) -> str:
    """Per deployment, the larger of two queries; either alone where the other has no series."""
    return f"(({first}) > ({second})) or ({second}) or ({first})"


def _smoothed_gauge(metric: str, labels: MetricsLabels, reduce: str = "sum") -> str:
    return f"{reduce} by ({labels.group}) (avg_over_time({metric}[{GAUGE_SMOOTHING_S}s]))"


def _peak_rate(metric: str, labels: MetricsLabels, window: str) -> str:
    """The highest PEAK_RATE_INTERVAL_S rate of the summed counter within the window (a subquery)."""
    return (f"max_over_time((sum by ({labels.group}) (rate({metric}[{PEAK_RATE_INTERVAL_S:g}s])))"
            f"[{window}:{PEAK_RATE_STEP_S:g}s])")


def _first_of(*queries: str) -> str:
    return " or ".join(f"({q})" for q in queries)


def _hit_rate(hits: str, queries: str, labels: MetricsLabels, window: str) -> str:
    """rate(hits) / rate(queries); no sample where nothing was queried (never 0/0)."""
    return f"{_sum_rate(hits, labels, window)} / ({_sum_rate(queries, labels, window)} > 0)"


def _mean_engine_rate(metric: str, labels: MetricsLabels, window: str) -> str:
    """A counter's rate averaged over the deployment's engines (one series each): a per-GPU counter
    stays per GPU, and one pod with N data-parallel engines is not counted N times."""
    return f"avg by ({labels.group}) (rate({metric}[{window}]))"


def build_bucket_queries(labels: MetricsLabels, window_s: int) -> dict[str, str]:
    """The PromQL of the bucket rates behind each percentile field of Observation, keyed by field."""
    w = f"{max(int(window_s), 1)}s"
    return {
        "ttft_s": _buckets(labels, w, "vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
        "tpot_s": _buckets(labels, w, "vllm:request_time_per_output_token_seconds",
                           "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
                           "sglang:inter_token_latency_seconds"),
        # The prefill-time buckets (0.3, 0.5, 0.8, 1 s, ...) resolve a long-prompt tail far better than
        # the prompt-length ones (1-2-5 per decade: 5k-10k tokens is one bucket); below 0.3 s they do
        # not resolve it at all, and the prompt lengths are what is left.
        "prefill_quantile_s": _buckets(labels, w, "vllm:request_prefill_time_seconds"),
        "input_tokens_quantile": _buckets(labels, w, "vllm:request_prompt_tokens"),
    }


def build_arrivals_query(labels: MetricsLabels, window_s: int) -> str:
    """Served requests/s per deployment over `window_s`: the history the forecasters are seeded with
    after a restart (a range query at one point per forecast bucket)."""
    w = f"{max(int(window_s), 1)}s"
    return _first_of(_sum_rate(f"vllm:request_success_total{{{SERVED}}}", labels, w),
                     _sum_rate("sglang:num_requests_total", labels, w))


def build_in_flight_by_pod_query(labels: MetricsLabels) -> str:
    """Requests running plus waiting per pod, averaged over GAUGE_SMOOTHING_S (one instant of a gauge can
    miss a busy engine): which pods a scale-down should spare."""
    by_pod = f"{labels.group}, {labels.pod}"

    def smoothed(metric: str, reduce: str) -> str:
        return f"{reduce} by ({by_pod}) (avg_over_time({metric}[{GAUGE_SMOOTHING_S}s]))"

    return _first_of(f"{smoothed('vllm:num_requests_running', 'sum')} + {smoothed('vllm:num_requests_waiting', 'sum')}",
                     f"{smoothed('sglang:num_running_reqs', 'max')} + {smoothed('sglang:num_queue_reqs', 'max')}")


def build_queries(labels: MetricsLabels, window_s: int) -> dict[str, str]:
    """The PromQL of each scalar Observation field, keyed by field name."""
    w = f"{max(int(window_s), 1)}s"
    served = f"vllm:request_success_total{{{SERVED}}}"
    return {
        "pods_scraped": _first_of(f"count by ({labels.group}) (count by ({labels.group}, {labels.pod}) "
                                  "(vllm:num_requests_running))",
                                  _per_pod_gauge("sglang:num_running_reqs", labels, "count")),
        "sampled_at_s": _first_of(f"max by ({labels.group}) (timestamp(vllm:num_requests_running))",
                                  f"max by ({labels.group}) (timestamp(sglang:num_running_reqs))"),
        "request_rate": _first_of(_sum_rate(served, labels, w),
                                  _sum_rate("sglang:num_requests_total", labels, w)),
        "peak_request_rate": _first_of(_peak_rate(served, labels, w),
                                       _peak_rate("sglang:num_requests_total", labels, w)),
        "aborted_rate": _first_of(_client_aborts(labels, w), *_unserved("abort", labels, w),
                                  _sum_rate("sglang:num_aborted_requests_total", labels, w)),
        "failed_rate": _first_of(*_unserved("error", labels, w)),
        "mean_input_tokens": _first_of(_mean_of_histogram("vllm:request_prompt_tokens", labels, w),
                                       f"{_sum_rate('sglang:prompt_tokens_total', labels, w)} / "
                                       f"{_sum_rate('sglang:num_requests_total', labels, w)}"),
        "mean_output_tokens": _first_of(_mean_of_histogram("vllm:request_generation_tokens", labels, w),
                                        f"{_sum_rate('sglang:generation_tokens_total', labels, w)} / "
                                        f"{_sum_rate('sglang:num_requests_total', labels, w)}"),
        "running_requests": _first_of(
            _larger(_smoothed_gauge("vllm:num_requests_running", labels),
                    _sum_rate("vllm:request_inference_time_seconds_sum", labels, f"{GAUGE_SMOOTHING_S}s")),
            _per_pod_gauge(f"avg_over_time(sglang:num_running_reqs[{GAUGE_SMOOTHING_S}s])", labels)),
        "mean_running_requests": _first_of(
            _larger(f"sum by ({labels.group}) (avg_over_time(vllm:num_requests_running[{w}]))",
                    _sum_rate("vllm:request_inference_time_seconds_sum", labels, w)),
            _per_pod_gauge(f"avg_over_time(sglang:num_running_reqs[{w}])", labels)),
        # a queue that builds up is seen at once in the gauge; one that fills and drains between scrapes
        # only in the time requests spent waiting
        "waiting_requests": _first_of(
            _larger(f"sum by ({labels.group}) (vllm:num_requests_waiting)",
                    _sum_rate("vllm:request_queue_time_seconds_sum", labels, f"{GAUGE_SMOOTHING_S}s")),
            _per_pod_gauge("sglang:num_queue_reqs", labels)),
        "kv_cache_usage": _first_of(_smoothed_gauge("vllm:kv_cache_usage_perc", labels, "avg"),
                                    _smoothed_gauge("vllm:gpu_cache_usage_perc", labels, "avg"),
                                    _per_pod_gauge(f"avg_over_time(sglang:token_usage[{GAUGE_SMOOTHING_S}s])",
                                                   labels, "avg")),
        "tpot_mean_s": _first_of(_mean_of_histogram("vllm:request_time_per_output_token_seconds", labels, w),
                                 _mean_of_histogram("vllm:inter_token_latency_seconds", labels, w),
                                 _mean_of_histogram("vllm:time_per_output_token_seconds", labels, w),
                                 _mean_of_histogram("sglang:inter_token_latency_seconds", labels, w)),
        "preemption_rate": _sum_rate("vllm:num_preemptions_total", labels, w),
        "mean_queue_time_s": _mean_of_histogram("vllm:request_queue_time_seconds", labels, w),
        "prefill_s": _mean_of_histogram("vllm:request_prefill_time_seconds", labels, w),
        # prompt tokens served from the prefix cache over prompt tokens looked up; vLLM < 0.10 (V1)
        # named the counters gpu_prefix_cache_*, the V0 engine exported a gauge
        "prefix_cache_hit_rate": _first_of(
            _hit_rate("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", labels, w),
            _hit_rate("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total", labels, w),
            f"avg by ({labels.group}) (avg_over_time(vllm:gpu_prefix_cache_hit_rate[{w}]))"),
        # the engine's own estimate of the work it did (vLLM >= 0.17 with --enable-mfu-metrics), per GPU
        "estimated_flops_per_s_per_gpu": _mean_engine_rate("vllm:estimated_flops_per_gpu_total", labels, w),
        "estimated_read_bytes_per_s_per_gpu": _mean_engine_rate("vllm:estimated_read_bytes_per_gpu_total",
                                                                labels, w),
        "estimated_write_bytes_per_s_per_gpu": _mean_engine_rate("vllm:estimated_write_bytes_per_gpu_total",
                                                                 labels, w),
        # one observation of the tokens-per-iteration histogram per engine step: work per step (above)
        "engine_steps_per_s": _mean_engine_rate("vllm:iteration_tokens_total_count", labels, w),
    }

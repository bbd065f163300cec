"""PromQL for every signal the autoscaler uses, one query per signal for all deployments at once.

Series are grouped by the target labels that name a deployment (`namespace`, `llmdeployment` by
default: relabel the pod label `kvscale.dev/llmdeployment` to `llmdeployment` in the scrape config).
vLLM's current names come first, with `or` fallbacks to renamed ones (`gpu_cache_usage_perc`,
`time_per_output_token_seconds`) and to SGLang's. SGLang exports one series per TP rank, so its gauges
are reduced per pod with `max` before summing over pods.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscale.autoscaler.signals import PEAK_RATE_INTERVAL_S, PEAK_RATE_STEP_S


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


def _quantile(metric: str, labels: MetricsLabels, window: str, quantile: float) -> str:
    return (f"histogram_quantile({quantile:g}, sum by ({labels.group}, le) "
            f"(rate({metric}_bucket[{window}])))")


def _peak_rate(metric: str, labels: MetricsLabels, window: str) -> str:
    """The highest PEAK_RATE_INTERVAL_S rate of the summed counter within the window (a subquery)."""
    return (f"max_over_time((sum by ({labels.group}) (rate({metric}[{PEAK_RATE_INTERVAL_S:g}s])))"
            f"[{window}:{PEAK_RATE_STEP_S:g}s])")


def _first_of(*queries: str) -> str:
    return " or ".join(f"({q})" for q in queries)


def build_queries(labels: MetricsLabels, window_s: int, quantile: float) -> dict[str, str]:
    """The PromQL of each Observation field, keyed by field name."""
    w = f"{max(int(window_s), 1)}s"
    return {
        "pods_scraped": _first_of(f"count by ({labels.group}) (vllm:num_requests_running)",
                                  _per_pod_gauge("sglang:num_running_reqs", labels, "count")),
        "sampled_at_s": _first_of(f"max by ({labels.group}) (timestamp(vllm:num_requests_running))",
                                  f"max by ({labels.group}) (timestamp(sglang:num_running_reqs))"),
        "request_rate": _first_of(_sum_rate("vllm:request_success_total", labels, w),
                                  _sum_rate("sglang:num_requests_total", labels, w)),
        "peak_request_rate": _first_of(_peak_rate("vllm:request_success_total", labels, w),
                                       _peak_rate("sglang:num_requests_total", labels, w)),
        "mean_input_tokens": _first_of(_mean_of_histogram("vllm:request_prompt_tokens", labels, w),
                                       f"{_sum_rate('sglang:prompt_tokens_total', labels, w)} / "
                                       f"{_sum_rate('sglang:num_requests_total', labels, w)}"),
        "mean_output_tokens": _first_of(_mean_of_histogram("vllm:request_generation_tokens", labels, w),
                                        f"{_sum_rate('sglang:generation_tokens_total', labels, w)} / "
                                        f"{_sum_rate('sglang:num_requests_total', labels, w)}"),
        "running_requests": _first_of(f"sum by ({labels.group}) (vllm:num_requests_running)",
                                      _per_pod_gauge("sglang:num_running_reqs", labels)),
        "mean_running_requests": _first_of(
            f"sum by ({labels.group}) (avg_over_time(vllm:num_requests_running[{w}]))",
            _per_pod_gauge(f"avg_over_time(sglang:num_running_reqs[{w}])", labels)),
        "waiting_requests": _first_of(f"sum by ({labels.group}) (vllm:num_requests_waiting)",
                                      _per_pod_gauge("sglang:num_queue_reqs", labels)),
        "kv_cache_usage": _first_of(f"avg by ({labels.group}) (vllm:kv_cache_usage_perc)",
                                    f"avg by ({labels.group}) (vllm:gpu_cache_usage_perc)",
                                    _per_pod_gauge("sglang:token_usage", labels, "avg")),
        "ttft_s": _first_of(_quantile("vllm:time_to_first_token_seconds", labels, w, quantile),
                            _quantile("sglang:time_to_first_token_seconds", labels, w, quantile)),
        "tpot_s": _first_of(_quantile("vllm:request_time_per_output_token_seconds", labels, w, quantile),
                            _quantile("vllm:inter_token_latency_seconds", labels, w, quantile),
                            _quantile("vllm:time_per_output_token_seconds", labels, w, quantile),
                            _quantile("sglang:inter_token_latency_seconds", labels, w, quantile)),
        "tpot_mean_s": _first_of(_mean_of_histogram("vllm:request_time_per_output_token_seconds", labels, w),
                                 _mean_of_histogram("vllm:inter_token_latency_seconds", labels, w),
                                 _mean_of_histogram("vllm:time_per_output_token_seconds", labels, w),
                                 _mean_of_histogram("sglang:inter_token_latency_seconds", labels, w)),
        "preemption_rate": _sum_rate("vllm:num_preemptions_total", labels, w),
        "prefill_s": _mean_of_histogram("vllm:request_prefill_time_seconds", labels, w),
        # The prefill-time buckets (0.3, 0.5, 0.8, 1 s, ...) resolve a long-prompt tail far better than
        # the prompt-length ones (1-2-5 per decade: 5k-10k tokens is one bucket).
        "prefill_quantile_s": _quantile("vllm:request_prefill_time_seconds", labels, w, quantile),
    }

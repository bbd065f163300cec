"""PromQL built for the autoscaler: one query per signal, grouped by deployment, with fallbacks."""

from kvscale.autoscaler.signals import Observation
from kvscale.metrics import MetricsLabels, build_queries
from kvscale.metrics.queries import build_bucket_queries

# Fields the source fills from other fields, not from a query of their own (the histograms: from the
# percentiles' bucket queries).
DERIVED = {"sampled_at_s", "window_s", "below_resolution", "ttft_buckets", "tpot_buckets"}
FIELDS = set(Observation.__dataclass_fields__) | {"prefill_s"}


def test_every_observation_field_has_a_query() -> None:
    scalar, buckets = build_queries(MetricsLabels(), 60), build_bucket_queries(MetricsLabels(), 60)
    assert not set(scalar) & set(buckets)
    assert set(scalar) | set(buckets) | DERIVED >= FIELDS
    assert set(scalar) | set(buckets) <= FIELDS


def test_queries_group_by_the_deployment_labels() -> None:
    labels = MetricsLabels(namespace="ns", deployment="app")
    queries = build_queries(labels, 30) | build_bucket_queries(labels, 30)
    for name, promql in queries.items():
        assert "by (ns, app" in promql, name
    assert "[30s]" in queries["request_rate"]
    # Percentiles are read as bucket rates: the caller decides whether the buckets resolve them.
    assert "histogram_quantile" not in queries["ttft_s"]
    assert "sum by (ns, app, le) (rate(vllm:time_to_first_token_seconds_bucket[30s]))" in queries["ttft_s"]


def test_renamed_and_sglang_metrics_are_fallbacks() -> None:
    queries = build_queries(MetricsLabels(), 60) | build_bucket_queries(MetricsLabels(), 60)
    kv = queries["kv_cache_usage"]
    assert kv.index("vllm:kv_cache_usage_perc") < kv.index("vllm:gpu_cache_usage_perc") < kv.index("sglang:token_usage")
    tpot = queries["tpot_s"]
    assert tpot.index("request_time_per_output_token") < tpot.index("inter_token_latency") < tpot.index(
        "vllm:time_per_output_token_seconds")
    # A later family only stands in for a deployment that has none of the earlier ones, never per bucket.
    assert "unless on (namespace, llmdeployment) ((sum by (namespace, llmdeployment, le) " \
           "(rate(vllm:request_time_per_output_token_seconds_bucket[60s]))))" in tpot
    assert "sglang:num_requests_total" in queries["request_rate"]
    # SGLang exports a series per TP rank: reduce per pod first.
    assert "max by (namespace, llmdeployment, pod) (avg_over_time(sglang:num_running_reqs[30s]))" \
        in queries["running_requests"]


def test_served_aborted_and_failed_requests_are_read_apart() -> None:
    queries = build_queries(MetricsLabels(), 60)
    for field in ("request_rate", "peak_request_rate"):
        assert 'vllm:request_success_total{finished_reason!~"abort|error",finish_reason!~"abort|error"}' \
            in queries[field], field
    assert 'finished_reason="abort"' in queries["aborted_rate"]
    # vLLM 0.32 records no finished request for a client that disconnects: its HTTP responses beyond
    # the finished requests are the abandoned ones.
    assert queries["aborted_rate"].startswith('(clamp_min(sum by (namespace, llmdeployment) '
                                              '(rate(http_requests_total{handler=~"/v1/completions|')
    assert 'finished_reason="error"' in queries["failed_rate"]


def test_pods_are_counted_as_pods_not_engine_series() -> None:
    # vLLM exports one series per data-parallel engine (label `engine`) on one pod.
    pods = build_queries(MetricsLabels(), 60)["pods_scraped"]
    assert pods.startswith("(count by (namespace, llmdeployment) (count by (namespace, llmdeployment, pod) ")


def test_gauges_are_averaged_over_the_last_scrapes() -> None:
    # One scrape of num_requests_running reads 0 between two engine steps with every client busy.
    queries = build_queries(MetricsLabels(), 60)
    assert "avg_over_time(vllm:num_requests_running[30s])" in queries["running_requests"]
    # ... and a real vLLM read 0 in 32 of 40 scrapes with 4 busy clients: at least Little's law from the
    # time finished requests spent running, a counter no scrape misses.
    assert "rate(vllm:request_inference_time_seconds_sum[30s])" in queries["running_requests"]
    assert "rate(vllm:request_inference_time_seconds_sum[60s])" in queries["mean_running_requests"]
    assert "rate(vllm:request_queue_time_seconds_sum[30s])" in queries["waiting_requests"]
    assert "avg_over_time(vllm:kv_cache_usage_perc[30s])" in queries["kv_cache_usage"]


def test_prefix_cache_hit_rate_is_hits_over_queries_with_renamed_and_v0_fallbacks() -> None:
    hit_rate = build_queries(MetricsLabels(), 60)["prefix_cache_hit_rate"]
    assert hit_rate.startswith("(sum by (namespace, llmdeployment) (rate(vllm:prefix_cache_hits_total[60s])) / "
                               "(sum by (namespace, llmdeployment) (rate(vllm:prefix_cache_queries_total[60s])) > 0))")
    # no sample where nothing was looked up: never 0/0
    assert hit_rate.index("vllm:prefix_cache_hits_total") < hit_rate.index("vllm:gpu_prefix_cache_hits_total") \
        < hit_rate.index("vllm:gpu_prefix_cache_hit_rate")


def test_the_engines_work_counters_stay_per_gpu() -> None:
    queries = build_queries(MetricsLabels(), 60)
    # per-GPU counters, one series per engine: averaged over engines, never summed over them
    for field, metric in (("estimated_flops_per_s_per_gpu", "vllm:estimated_flops_per_gpu_total"),
                          ("estimated_read_bytes_per_s_per_gpu", "vllm:estimated_read_bytes_per_gpu_total"),
                          ("estimated_write_bytes_per_s_per_gpu", "vllm:estimated_write_bytes_per_gpu_total"),
                          ("engine_steps_per_s", "vllm:iteration_tokens_total_count")):
        assert queries[field] == f"avg by (namespace, llmdeployment) (rate({metric}[60s]))"


def test_requests_in_flight_are_read_per_pod_for_both_engines() -> None:
    from kvscale.metrics.queries import build_in_flight_by_pod_query

    promql = build_in_flight_by_pod_query(MetricsLabels(namespace="ns", deployment="app", pod="instance_pod"))
    assert "sum by (ns, app, instance_pod) (avg_over_time(vllm:num_requests_running[30s]))" in promql
    assert "sum by (ns, app, instance_pod) (avg_over_time(vllm:num_requests_waiting[30s]))" in promql
    # SGLang repeats the same gauge on every TP rank of a pod: max, not sum
    assert "max by (ns, app, instance_pod) (avg_over_time(sglang:num_running_reqs[30s]))" in promql
    assert ") or (" in promql

"""PromQL built for the autoscaler: one query per signal, grouped by deployment, with fallbacks."""

from kvscale.autoscaler.signals import Observation
from kvscale.metrics import MetricsLabels, build_queries

FIELDS = set(Observation.__dataclass_fields__) | {"prefill_s"}


def test_every_observation_field_has_a_query() -> None:
    queries = build_queries(MetricsLabels(), 60, 0.95)
    assert set(queries) | {"sampled_at_s", "window_s"} >= FIELDS  # the window is the source's own
    assert set(queries) <= FIELDS


def test_queries_group_by_the_deployment_labels() -> None:
    queries = build_queries(MetricsLabels(namespace="ns", deployment="app"), 30, 0.9)
    for name, promql in queries.items():
        assert "by (ns, app" in promql, name
    assert "[30s]" in queries["request_rate"]
    assert "histogram_quantile(0.9," in queries["ttft_s"]


def test_renamed_and_sglang_metrics_are_fallbacks() -> None:
    queries = build_queries(MetricsLabels(), 60, 0.95)
    kv = queries["kv_cache_usage"]
    assert kv.index("vllm:kv_cache_usage_perc") < kv.index("vllm:gpu_cache_usage_perc") < kv.index("sglang:token_usage")
    tpot = queries["tpot_s"]
    assert tpot.index("request_time_per_output_token") < tpot.index("inter_token_latency") < tpot.index(
        "vllm:time_per_output_token_seconds")
    assert "sglang:num_requests_total" in queries["request_rate"]
    # SGLang exports a series per TP rank: reduce per pod first.
    assert "max by (namespace, llmdeployment, pod) (sglang:num_running_reqs)" in queries["running_requests"]

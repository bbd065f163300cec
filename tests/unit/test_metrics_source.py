"""Reading one fetch's samples into Observations (Prometheus replaced by canned query results)."""

from __future__ import annotations

from typing import Any

import pytest

from kvscale.metrics import DeploymentKey, PrometheusSource, build_queries
from kvscale.metrics.queries import MetricsLabels

KEY = DeploymentKey("serving", "chat")


def _source(values: dict[str, float], monkeypatch: pytest.MonkeyPatch) -> PrometheusSource:
    """A source whose every query answers with `values[field]` for KEY (nothing for other fields)."""
    source = PrometheusSource("http://prometheus.invalid:9090", window_s=60)
    by_query = {promql: field for field, promql in build_queries(MetricsLabels(), 60).items()}

    def custom_query(query: str, params: dict[str, str]) -> list[dict[str, Any]]:
        field = by_query.get(query)
        if query == "vector(time())":
            return [{"metric": {}, "value": [1000.0, "1000"]}]
        if field is None or field not in values:
            return []
        return [{"metric": {"namespace": KEY.namespace, "llmdeployment": KEY.name},
                 "value": [1000.0, repr(values[field])]}]

    monkeypatch.setattr(source._client, "custom_query", custom_query)
    return source


BASE = {"sampled_at_s": 995.0, "pods_scraped": 1.0, "request_rate": 2.0, "running_requests": 3.0,
        "waiting_requests": 0.0}


def test_the_prefix_hit_rate_and_work_counters_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {**BASE, "prefix_cache_hit_rate": 0.25, "estimated_flops_per_s_per_gpu": 3e14,
              "estimated_read_bytes_per_s_per_gpu": 1.5e12, "estimated_write_bytes_per_s_per_gpu": 2e10,
              "engine_steps_per_s": 60.0}
    observation = _source(values, monkeypatch).fetch([KEY], 0.95).observations[KEY]
    assert observation.prefix_cache_hit_rate == 0.25
    assert observation.estimated_flops_per_s_per_gpu == 3e14
    assert observation.estimated_hbm_bytes_per_s_per_gpu == pytest.approx(1.52e12)
    assert observation.engine_steps_per_s == 60.0


def test_counters_at_zero_are_absent_and_a_share_stays_a_share(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM exports the MFU counters at 0 without --enable-mfu-metrics: no work measured, not no work done
    values = {**BASE, "prefix_cache_hit_rate": 1.0000004, "estimated_flops_per_s_per_gpu": 0.0,
              "estimated_read_bytes_per_s_per_gpu": 0.0, "estimated_write_bytes_per_s_per_gpu": 0.0,
              "engine_steps_per_s": 0.0}
    observation = _source(values, monkeypatch).fetch([KEY], 0.95).observations[KEY]
    assert observation.estimated_flops_per_s_per_gpu is None
    assert observation.estimated_hbm_bytes_per_s_per_gpu is None
    assert observation.engine_steps_per_s is None
    assert observation.prefix_cache_hit_rate == 1.0  # two rates extrapolated apart can overshoot 1


def test_an_engine_without_the_series_reads_none(monkeypatch: pytest.MonkeyPatch) -> None:
    observation = _source(BASE, monkeypatch).fetch([KEY], 0.95).observations[KEY]
    assert observation.prefix_cache_hit_rate is None and observation.estimated_flops_per_s_per_gpu is None

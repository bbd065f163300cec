"""The Prometheus edge: the only importer of prometheus_api_client. Queries in, Observations out."""

from kvscale.metrics.queries import DEFAULT_WINDOW_S, MIN_WINDOW_S, DeploymentKey, MetricsLabels, build_queries
from kvscale.metrics.source import MetricsUnavailableError, PrometheusSource

__all__ = ["DEFAULT_WINDOW_S", "MIN_WINDOW_S", "DeploymentKey", "MetricsLabels", "MetricsUnavailableError",
           "PrometheusSource", "build_queries"]

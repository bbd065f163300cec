"""The operator's own Prometheus metrics (prometheus_client), served on --metrics-port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

LABELS = ("namespace", "name")


class Telemetry:
    """Counters and per-resource gauges; one registry per operator instance (tests run several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("kvscale_reconciles_total", "Reconcile passes, by result.", ["result"],
                                  registry=self.registry)
        self.writes = Counter("kvscale_writes_total", "Writes to the Kubernetes API, by kind.", ["kind"],
                              registry=self.registry)
        self.decisions = Counter("kvscale_scale_decisions_total", "Scaling decisions, by action.",
                                 [*LABELS, "action"], registry=self.registry)
        self.desired_replicas = Gauge("kvscale_desired_replicas", "Replicas kvscale wants.", LABELS,
                                      registry=self.registry)
        self.predicted_ttft = Gauge("kvscale_predicted_ttft_seconds", "Predicted TTFT at the SLO percentile.",
                                    LABELS, registry=self.registry)
        self.predicted_tpot = Gauge("kvscale_predicted_tpot_seconds", "Predicted TPOT at the SLO percentile.",
                                    LABELS, registry=self.registry)
        self.observed_ttft = Gauge("kvscale_observed_ttft_seconds", "Observed TTFT at the SLO percentile.",
                                   LABELS, registry=self.registry)
        self.observed_tpot = Gauge("kvscale_observed_tpot_seconds", "Observed TPOT at the SLO percentile.",
                                   LABELS, registry=self.registry)

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)

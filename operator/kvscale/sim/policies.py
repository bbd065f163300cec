"""Scaling policies the fleet can run: kvscale's own, and the baselines people run today.

`kvscale` calls `kvscale.autoscaler.decide` (the function the operator calls) and
`kvscale.autoscaler.calibrate` on every decision; nothing of the policy is re-implemented here.
The baselines follow the Kubernetes HorizontalPodAutoscaler's algorithm and default behaviour:
15 s sync, 10% tolerance, no scale-up stabilization but at most max(4 pods, 100%) more per period,
scale-down to the highest recommendation of the last 300 s.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kvscale.autoscaler import (
    Calibration,
    Observation,
    ReplicaContext,
    ScaleDecision,
    ScalingHistory,
    calibrate,
    decide,
)
from kvscale.autoscaler.policy import REPLICA_STARTUP_S, build_calibration_sample, forecaster_of
from kvscale.autoscaler.startup import startup_percentile_s
from kvscale.sim.deployment import SimulatedDeployment
from kvscale.sim.observe import WindowStats

POLICIES = ("kvscale", "static-peak", "hpa-kv", "hpa-queue")
HPA_TOLERANCE = 0.1
HPA_SCALE_UP_PODS = 4
HPA_SCALE_DOWN_WINDOW_S = 300.0
HPA_KV_TARGET = 0.7
HPA_QUEUE_TARGET = 5.0


@dataclass(frozen=True)
class FleetState:
    """The Deployment as the scaler sees it at one sync."""

    now_s: float
    current_replicas: int  # spec.replicas: ready plus starting
    ready_replicas: int
    starting_replicas: int
    free_replica_slots: int | None
    startups_s: tuple[float, ...] = ()  # scale-up to Ready of each replica that came up so far
    decision_interval_s: float = 15.0


class ScalingPolicy(Protocol):
    name: str

    def initial_replicas(self) -> int: ...

    def desired_replicas(self, stats: WindowStats, fleet: FleetState) -> int: ...

    def summary(self) -> dict[str, Any]: ...


def within_replica_bounds(replicas: int, deployment: SimulatedDeployment) -> int:
    """`replicas` within the resource's scaling bounds (and at least one), as every policy runs."""
    scaling = deployment.spec.scaling
    return min(max(replicas, scaling.min_replicas, 1), scaling.max_replicas)


def planned_replicas(deployment: SimulatedDeployment) -> int:
    """Where the operator starts a new Deployment: the plan's replicas within the scaling bounds."""
    return within_replica_bounds(deployment.chosen.replicas, deployment)


class KvscalePolicy:
    """kvscale's policy: calibrate the model on what the servers show, then `decide`."""

    name = "kvscale"

    def __init__(self, deployment: SimulatedDeployment, initial: int | None = None, calibrated: bool = True) -> None:
        self.deployment = deployment
        self.calibrated = calibrated
        self._initial = initial if initial is not None else planned_replicas(deployment)
        self.calibration = Calibration()
        self.history = ScalingHistory()
        self.last: ScaleDecision | None = None
        self.bindings: Counter[str] = Counter()
        self.actions: Counter[str] = Counter()

    def initial_replicas(self) -> int:
        return self._initial

    def desired_replicas(self, stats: WindowStats, fleet: FleetState) -> int:
        d = self.deployment
        observation = stats.observation
        context = ReplicaContext(spec=d.spec, setup=d.setup, max_num_seqs=d.max_num_seqs,
                                 kv_cache_tokens=d.chosen.kv_cache_tokens, current_replicas=fleet.current_replicas,
                                 ready_replicas=fleet.ready_replicas, free_replica_slots=fleet.free_replica_slots,
                                 calibration=self.calibration,
                                 startup_s=startup_percentile_s(fleet.startups_s, REPLICA_STARTUP_S),
                                 decision_interval_s=fleet.decision_interval_s,
                                 forecaster=forecaster_of(d.spec))
        if self.calibrated and observation.pods_scraped:
            sample = build_calibration_sample(context, observation, prefill_mean_s=stats.mean_prefill_s)
            self.calibration = calibrate(self.calibration, d.setup, sample)
            context = replace(context, calibration=self.calibration)
        decision = decide(observation, context, self.history, fleet.now_s)
        self.history = decision.history
        self.last = decision
        self.bindings[decision.binding] += 1
        self.actions[decision.action] += 1
        return decision.desired_replicas

    def summary(self) -> dict[str, Any]:
        c = self.calibration
        return {
            "calibration": {
                "enabled": self.calibrated,
                "decode_factor": round(c.decode_factor, 4),
                "prefill_factor": round(c.prefill_factor, 4),
                "tpot_error_pct": None if c.tpot_error_pct is None else round(c.tpot_error_pct, 2),
                "ttft_error_pct": None if c.ttft_error_pct is None else round(c.ttft_error_pct, 2),
                "samples": c.samples,
            },
            "forecast": None if self.last is None or self.last.forecast is None else {
                "forecaster": self.last.forecast.forecaster.value,
                "backtest_error_pct": {f.value: None if e is None else round(e, 2)
                                       for f, e in self.history.forecasts.backtest().items()},
            },
            "decisions_by_binding": dict(sorted(self.bindings.items())),
            "decisions_by_action": dict(sorted(self.actions.items())),
            "last_reason": self.last.reason if self.last else None,
        }


class StaticPolicy:
    """A fixed replica count (for the peak: the peak-minute rate over a load-tested per-server capacity)."""

    name = "static-peak"

    def __init__(self, replicas: int, peak_rate: float = 0.0, capacity_per_replica: float = 0.0,
                 detail: dict[str, Any] | None = None) -> None:
        self.replicas = max(replicas, 1)
        self.peak_rate = peak_rate
        self.capacity = capacity_per_replica
        self.detail = detail or {}

    @staticmethod
    def replicas_for_peak(peak_rate: float, capacity_per_replica: float) -> int:
        return math.ceil(peak_rate / capacity_per_replica - 1e-9) if capacity_per_replica > 0 else 1

    def initial_replicas(self) -> int:
        return self.replicas

    def desired_replicas(self, stats: WindowStats, fleet: FleetState) -> int:
        return self.replicas

    def summary(self) -> dict[str, Any]:
        return {"peak_rate_per_s": round(self.peak_rate, 3), "capacity_per_replica": round(self.capacity, 4),
                "replicas": self.replicas, **self.detail}


class HpaPolicy:
    """A HorizontalPodAutoscaler on one per-pod metric with an average-value target, default behaviour."""

    def __init__(self, name: str, metric: Callable[[Observation], float | None], target: float, initial: int,
                 min_replicas: int, max_replicas: int) -> None:
        self.name = name
        self.metric = metric
        self.target = target
        self._initial = initial
        self.min_replicas = max(min_replicas, 1)
        self.max_replicas = max_replicas
        self.recommendations: list[tuple[float, int]] = []
        self.skipped = 0

    def initial_replicas(self) -> int:
        return self._initial

    def _raw(self, value: float, fleet: FleetState) -> int:
        """HPA's replica calculation: missing (starting) pods count as idle when scaling up."""
        current = fleet.current_replicas
        ready = max(fleet.ready_replicas, 1)
        ratio = value / self.target
        if abs(ratio - 1.0) <= HPA_TOLERANCE:
            return current
        if ratio > 1.0 and fleet.starting_replicas:
            adjusted = value * ready / (ready + fleet.starting_replicas) / self.target
            if adjusted <= 1.0 + HPA_TOLERANCE:
                return current
            return math.ceil(adjusted * (ready + fleet.starting_replicas))
        return math.ceil(ratio * ready)

    def desired_replicas(self, stats: WindowStats, fleet: FleetState) -> int:
        value = self.metric(stats.observation) if stats.observation.pods_scraped else None
        current = fleet.current_replicas
        if value is None:
            self.skipped += 1
            return current
        now = fleet.now_s
        recommended = min(max(self._raw(value, fleet), self.min_replicas), self.max_replicas)
        self.recommendations = [(t, r) for t, r in self.recommendations if now - t < HPA_SCALE_DOWN_WINDOW_S]
        self.recommendations.append((now, recommended))
        if recommended > current:
            return min(recommended, max(current + HPA_SCALE_UP_PODS, 2 * current))
        stabilized = max(r for _, r in self.recommendations)
        return min(stabilized, current)

    def summary(self) -> dict[str, Any]:
        return {"target": self.target, "syncs_without_metric": self.skipped}


def kv_usage(observation: Observation) -> float | None:
    return observation.kv_cache_usage


def waiting_per_pod(observation: Observation) -> float | None:
    if observation.waiting_requests is None or not observation.pods_scraped:
        return None
    return observation.waiting_requests / observation.pods_scraped


__all__ = ["HPA_KV_TARGET", "HPA_QUEUE_TARGET", "POLICIES", "FleetState", "HpaPolicy", "KvscalePolicy",
           "ScalingPolicy", "StaticPolicy", "decide", "kv_usage", "planned_replicas", "waiting_per_pod",
           "within_replica_bounds"]

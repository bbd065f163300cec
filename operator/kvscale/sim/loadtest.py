"""How people size a static fleet: load-test one server, then provision for the peak.

The load test is what `vllm bench serve` (or guidellm) does against one real server: Poisson arrivals
at a fixed rate with the production request mix (lengths resampled from the trace), read the SLO
percentile of TTFT and TPOT, and find the highest rate at which both hold. The static fleet is the
trace's peak-minute rate over that per-server capacity. The load test runs the simulated servers at
their true speed and in their true form (the run's ServerForm), not kvscale's model: a fleet sized this
way knows the hardware exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvscale.sim.deployment import SimulatedDeployment
from kvscale.sim.fleet import FleetConfig, simulate
from kvscale.sim.policies import (
    HPA_KV_TARGET,
    HPA_QUEUE_TARGET,
    POLICIES,
    HpaPolicy,
    KvscalePolicy,
    ScalingPolicy,
    StaticPolicy,
    kv_usage,
    planned_replicas,
    waiting_per_pod,
    within_replica_bounds,
)
from kvscale.sim.server import MODEL_FORM, ServerForm
from kvscale.sim.trace import Trace

LOAD_TEST_REQUESTS = 1500  # per rate: a p99 then rests on ~15 requests, not on one outlier
BISECTION_STEPS = 10
MAX_DOUBLINGS = 12
LOAD_TEST_SEED = 0
PEAK_WINDOW_S = 60.0  # "the peak" as a dashboard shows it: the busiest minute


@dataclass(frozen=True)
class LoadTest:
    """The highest rate one server holds both SLOs at, as a load test measures it."""

    rate_per_replica: float  # requests/s
    ttft_ms: float | None  # at the SLO percentile, at that rate
    tpot_ms: float | None
    requests_per_rate: int


def _poisson_trace(trace: Trace, rate: float, count: int, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, trace.requests, count)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, count))
    return Trace(name=f"load test at {rate:.3f} req/s", arrival_s=arrivals, input_tokens=trace.input_tokens[picks],
                 output_tokens=trace.output_tokens[picks], duration_s=float(np.ceil(arrivals[-1] + 1e-9)))


def measure_at_rate(deployment: SimulatedDeployment, trace: Trace, rate: float, server_form: ServerForm = MODEL_FORM,
                    ) -> tuple[bool, float | None, float | None]:
    """(both SLOs held, TTFT ms, TPOT ms at the SLO percentile) for one server of `server_form` at `rate`."""
    load = _poisson_trace(trace, rate, LOAD_TEST_REQUESTS, LOAD_TEST_SEED)
    m = simulate(deployment, load, StaticPolicy(1), FleetConfig(tail_s=600.0, server_form=server_form)).metrics
    ttft, tpot = m["slo_percentile_ttft_ms"], m["slo_percentile_tpot_ms"]
    slo = deployment.spec.slo
    held = (not m["unfinished"] and ttft is not None and ttft <= slo.ttft_ms
            and (tpot is None or tpot <= slo.tpot_ms))
    return held, ttft, tpot


def load_test_capacity(deployment: SimulatedDeployment, trace: Trace, server_form: ServerForm = MODEL_FORM,
                       ) -> LoadTest:
    """Double the rate until one server (of `server_form`, as the fleet's) misses an SLO, then bisect between
    the last pass and that miss."""
    low, high = 0.0, 0.25
    best: tuple[float | None, float | None] = (None, None)
    for _ in range(MAX_DOUBLINGS):
        held, ttft, tpot = measure_at_rate(deployment, trace, high, server_form)
        if not held:
            break
        low, best, high = high, (ttft, tpot), 2 * high
    for _ in range(BISECTION_STEPS):
        rate = (low + high) / 2
        held, ttft, tpot = measure_at_rate(deployment, trace, rate, server_form)
        if held:
            low, best = rate, (ttft, tpot)
        else:
            high = rate
    return LoadTest(rate_per_replica=low, ttft_ms=best[0], tpot_ms=best[1], requests_per_rate=LOAD_TEST_REQUESTS)


def static_for_peak(deployment: SimulatedDeployment, trace: Trace, server_form: ServerForm = MODEL_FORM,
                    ) -> StaticPolicy:
    """The peak-minute rate over the load-tested capacity of one server, within the resource's replica
    bounds (as every policy is): where one server holds the SLO only at a trickle, the quotient is no
    fleet anyone would run."""
    test = load_test_capacity(deployment, trace, server_form)
    peak_rate = trace.peak_rate(PEAK_WINDOW_S)
    wanted = StaticPolicy.replicas_for_peak(peak_rate, test.rate_per_replica)
    replicas = within_replica_bounds(wanted, deployment)
    detail: dict[str, Any] = {
        "load_test": {"rate_per_replica": round(test.rate_per_replica, 4), "ttft_ms": test.ttft_ms,
                      "tpot_ms": test.tpot_ms, "requests_per_rate": test.requests_per_rate}}
    if replicas != wanted:
        detail["unbounded_replicas"] = wanted
    return StaticPolicy(replicas, peak_rate, test.rate_per_replica, detail)


def build_policy(name: str, deployment: SimulatedDeployment, trace: Trace, initial: int | None = None,
                 calibrated: bool = True, server_form: ServerForm = MODEL_FORM) -> ScalingPolicy:
    """The named policy; `server_form` is the fleet's servers', which static-peak load-tests."""
    scaling = deployment.spec.scaling
    start = initial if initial is not None else planned_replicas(deployment)
    if name == "kvscale":
        return KvscalePolicy(deployment, start, calibrated)
    if name == "static-peak":
        return static_for_peak(deployment, trace, server_form)
    if name == "hpa-kv":
        return HpaPolicy("hpa-kv", kv_usage, HPA_KV_TARGET, start, scaling.min_replicas, scaling.max_replicas)
    if name == "hpa-queue":
        return HpaPolicy("hpa-queue", waiting_per_pod, HPA_QUEUE_TARGET, start, scaling.min_replicas,
                         scaling.max_replicas)
    raise ValueError(f"unknown policy {name!r}; use one of {', '.join(POLICIES)}")

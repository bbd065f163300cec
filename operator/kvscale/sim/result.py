"""What a simulation run reports: SLO attainment, latency percentiles, GPU-hours, cost, replicas."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvscale.perfmodel import EfficiencyFactors
from kvscale.sim.deployment import SimulatedDeployment
from kvscale.sim.policies import ScalingPolicy
from kvscale.sim.server import RequestLog
from kvscale.sim.trace import Trace
from kvscale.units import S_PER_HOUR, ms_to_s, s_to_ms


@dataclass(frozen=True)
class TimelinePoint:
    """The fleet at one scrape."""

    t_s: float
    arrival_rate: float  # arrivals/s since the previous scrape
    finished_rate: float  # over the window
    running: float
    waiting: float
    desired_replicas: int
    ready_replicas: int
    paid_replicas: int  # starting, ready and draining: what holds GPUs
    ttft_s: float | None  # at the SLO percentile over the window
    tpot_s: float | None
    kv_cache_usage: float | None


@dataclass(frozen=True)
class SimulationResult:
    metrics: dict[str, Any]
    timeline: tuple[TimelinePoint, ...] = field(repr=False)
    # Per request, in the trace's (arrival) order: whether it met both SLOs.
    met_slo: np.ndarray[Any, np.dtype[np.bool_]] = field(repr=False, default_factory=lambda: np.zeros(0, bool))

    def to_dict(self, with_timeline: bool = False) -> dict[str, Any]:
        body = dict(self.metrics)
        if with_timeline:
            body["timeline"] = [asdict(p) for p in self.timeline]
        return body


def _pct(values: np.ndarray[Any, Any], q: float) -> float | None:
    return round(s_to_ms(float(np.percentile(values, q))), 2) if values.size else None


def _efficiency(e: EfficiencyFactors) -> dict[str, float]:
    return {"hbm_bandwidth": round(e.hbm_bandwidth, 4), "attention_bandwidth": round(e.attention_bandwidth, 4),
            "compute": round(e.compute, 4), "step_overhead_ms": round(s_to_ms(e.step_overhead_s), 3)}


def summarize(deployment: SimulatedDeployment, trace: Trace, policy: ScalingPolicy, log: RequestLog,
              timeline: list[TimelinePoint], *, gpu_s: float, trace_gpu_s: float, busy_replica_s: float,
              simulated_s: float, replicas_created: int, server_form: str = "") -> SimulationResult:
    slo = deployment.spec.slo
    n = trace.requests
    finished = ~np.isnan(log.finish_s)
    ttft = log.first_token_s - log.arrival_s
    decode_s = log.finish_s - log.first_token_s
    intervals = np.maximum(log.output_tokens - 1, 1)
    tpot = np.where(log.output_tokens > 1, decode_s / intervals, 0.0)
    met = finished & (ttft <= ms_to_s(slo.ttft_ms)) & (tpot <= ms_to_s(slo.tpot_ms))
    good_tokens = float(log.output_tokens[met].sum())
    all_tokens = float(log.output_tokens[finished].sum())
    gpu_hours = gpu_s / S_PER_HOUR
    cost = gpu_hours * deployment.usd_per_gpu_hour
    duration = trace.duration_s
    ttft_done = ttft[finished]
    tpot_done = tpot[finished & (log.output_tokens > 1)]
    dropped = int(log.dropped.sum())
    paid = [p.paid_replicas for p in timeline]
    metrics: dict[str, Any] = {
        "policy": policy.name,
        "trace": trace.name,
        "deployment": deployment.label,
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "percentile": slo.percentile},
        "duration_s": round(duration, 3),
        "simulated_s": round(simulated_s, 3),
        "requests": n,
        "completed": int(finished.sum()),
        "dropped": dropped,
        "unfinished": int(n - finished.sum() - dropped),
        "preemptions": log.preemptions,
        "slo_attainment": round(float(met.sum()) / n, 5) if n else None,
        "ttft_attainment": round(float((finished & (ttft <= ms_to_s(slo.ttft_ms))).sum()) / n, 5) if n else None,
        "tpot_attainment": round(float((finished & (tpot <= ms_to_s(slo.tpot_ms))).sum()) / n, 5) if n else None,
        "goodput_tokens_per_s": round(good_tokens / duration, 3) if duration else None,
        "output_tokens_per_s": round(all_tokens / duration, 3) if duration else None,
        "p50_ttft_ms": _pct(ttft_done, 50), "p95_ttft_ms": _pct(ttft_done, 95), "p99_ttft_ms": _pct(ttft_done, 99),
        "p50_tpot_ms": _pct(tpot_done, 50), "p95_tpot_ms": _pct(tpot_done, 95), "p99_tpot_ms": _pct(tpot_done, 99),
        "slo_percentile_ttft_ms": _pct(ttft_done, slo.percentile),
        "slo_percentile_tpot_ms": _pct(tpot_done, slo.percentile),
        "gpu_hours": round(gpu_hours, 4),
        # Over the trace's span alone, without the tail simulated for requests in flight to finish.
        "trace_gpu_hours": round(trace_gpu_s / S_PER_HOUR, 4),
        "usd_per_gpu_hour": deployment.usd_per_gpu_hour,
        "cost": round(cost, 4),
        "tokens_per_dollar": round(good_tokens / cost, 1) if cost > 0 else None,
        "max_replicas": max((p.desired_replicas for p in timeline), default=0),
        "mean_replicas": round(gpu_s / deployment.gpus_per_replica / simulated_s, 3) if simulated_s else 0.0,
        "trace_mean_replicas": round(trace_gpu_s / deployment.gpus_per_replica / duration, 3) if duration else 0.0,
        "max_paid_replicas": max(paid, default=0),
        "replicas_started": replicas_created,
        "replica_utilisation": round(busy_replica_s / (gpu_s / deployment.gpus_per_replica), 4) if gpu_s else None,
        "server_efficiency": _efficiency(deployment.server_setup.efficiency),
        "planner_efficiency": _efficiency(deployment.setup.efficiency),
        "server_form": server_form or "as modelled",
        "note": ("the simulated servers are slower than the planner's default efficiency (decode and prefill "
                 "factors and per-step overhead above differ); kvscale calibrates its model online, the "
                 "baselines do not use the model"),
        "attribution": trace.attribution,
        "policy_detail": policy.summary(),
    }
    return SimulationResult(metrics=metrics, timeline=tuple(timeline), met_slo=met)

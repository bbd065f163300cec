"""Re-planning on the traffic served: is another configuration cheaper for what the servers really see?

The spec's workload is a guess made before the first request; calibration measures the request shape
(mean and tail prompt, output, prefix-cache hits), the speed and the tails, and the forecaster keeps a
day of per-minute arrival rates. This module runs the planner twice on that: once pinned to the running
configuration, once over everything the spec allows (its GPU types, pinned settings and replica
bounds), and prices each the way the autoscaler would run it: every minute's rate, plus headroom, over
the configuration's calibrated goodput, in whole replicas within the bounds. The GPU-hours a
configuration costs over the day, not at one rate, is what a platform team pays: a big tensor-parallel
replica that wins at the peak can lose the night.

Assumption, stated: the calibrated speed and tail factors (measured on the running GPU type and TP
degree) carry over to the other configurations; the alternatives are priced with them as measured.

Pure: no clock, no I/O; the operator decides when to call it and keeps what it answered in status.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvscale.api.conditions import ServingConfiguration
from kvscale.api.spec import LLMDeploymentSpec
from kvscale.errors import PlanningError
from kvscale.perfmodel.efficiency import EfficiencyFactors
from kvscale.perfmodel.serving import RequestShape
from kvscale.planner.plan import Candidate, serving_flags
from kvscale.planner.search import PlanInputs, plan_deployment

MINUTE_S = 60.0  # the rates priced are per closed minute (the forecaster's buckets)


@dataclass(frozen=True)
class ServedTraffic:
    """What the running deployment was asked to do, as calibration and the forecaster measured it."""

    shape: RequestShape  # calibrated: mean and tail prompt, output, prefix-cache hits
    minute_rates_per_s: tuple[float, ...]  # arrivals/s of each closed minute, oldest first
    efficiency: EfficiencyFactors  # the defaults times the calibrated speed factors
    ttft_tail_factor: float = 1.0  # observed / modelled percentile: the SLOs the model must hold shrink by it
    tpot_tail_factor: float = 1.0

    @property
    def mean_rate_per_s(self) -> float:
        rates = self.minute_rates_per_s
        return sum(rates) / len(rates) if rates else 0.0

    @property
    def peak_rate_per_s(self) -> float:
        return max(self.minute_rates_per_s, default=0.0)


@dataclass(frozen=True)
class FleetCost:
    """One configuration priced on the served traffic, replicas as the autoscaler would run them."""

    candidate: Candidate  # planned on the served workload (goodput, predictions at the mean rate)
    mean_replicas: float
    peak_replicas: int
    cost_per_hour: float  # mean over the minutes, $/h
    minutes_short: int  # minutes whose demand needs more replicas than maxReplicas allows

    @property
    def flags(self) -> tuple[str, int, int, int, int, int]:
        return serving_flags(self.candidate)


@dataclass(frozen=True)
class Replan:
    """The running configuration and the cheapest one on the same traffic, and why."""

    current: FleetCost | None  # None: the running configuration holds no SLO on this traffic
    best: FleetCost | None  # None: nothing the spec allows holds the SLOs on this traffic
    savings: float  # 1 - best / current cost; 0 when the running one is the best
    reason: str

    @property
    def moves(self) -> bool:
        """Whether the best configuration differs from the running one at all."""
        return self.best is not None and (self.current is None or self.best.flags != self.current.flags)


def served_spec(spec: LLMDeploymentSpec, traffic: ServedTraffic) -> LLMDeploymentSpec:
    """The spec as the planner should see the served traffic: its mean rate and shape, and SLOs tightened
    by the learned tail factors (what the model's percentiles must stay under for the real ones to hold)."""
    shape = traffic.shape
    workload = spec.workload.model_copy(update={
        "requests_per_second": traffic.mean_rate_per_s, "peak_requests_per_second": None,
        "input_tokens": max(1, round(shape.input_tokens)), "output_tokens": max(1, round(shape.output_tokens)),
        "prefix_cache_hit_rate": min(shape.prefix_cache_hit_rate, 0.99)})
    slo = spec.slo.model_copy(update={"ttft_ms": spec.slo.ttft_ms / traffic.ttft_tail_factor,
                                      "tpot_ms": spec.slo.tpot_ms / traffic.tpot_tail_factor})
    return spec.model_copy(update={"workload": workload, "slo": slo})


def price_on_traffic(candidate: Candidate, spec: LLMDeploymentSpec, rates_per_s: Sequence[float]) -> FleetCost:
    """The configuration run as the autoscaler would over `rates_per_s` (one per minute): each minute
    ceil(rate x (1 + headroom) / goodput) replicas within the spec's bounds, and no fewer than any minute
    of the scale-down stabilization window asked for (the autoscaler keeps those, and a configuration whose
    replicas are small pays that more often than one that sits at its floor)."""
    scaling = spec.scaling
    goodput = candidate.goodput_requests_per_s
    wanted: list[int] = []
    short = 0
    for rate in rates_per_s or (0.0,):
        needed = math.ceil(rate * (1.0 + scaling.headroom) / goodput - 1e-9) if goodput > 0 else scaling.max_replicas
        short += needed > scaling.max_replicas
        wanted.append(min(max(needed, scaling.min_replicas), scaling.max_replicas))
    held = max(0, math.ceil(scaling.scale_down_stabilization_seconds / MINUTE_S - 1e-9))
    counts = [max(wanted[max(0, i - held):i + 1]) for i in range(len(wanted))]
    mean = sum(counts) / len(counts)
    return FleetCost(candidate=candidate, mean_replicas=mean, peak_replicas=max(counts),
                     cost_per_hour=mean * candidate.gpus_per_replica * candidate.usd_per_gpu_hour, minutes_short=short)


def pinned_to(spec: LLMDeploymentSpec, running: ServingConfiguration) -> LLMDeploymentSpec:
    """The spec allowing only that configuration (its GPU type, TP, PP, DP and max-num-seqs)."""
    serving = spec.serving.model_copy(update={
        "tensor_parallel": running.tensor_parallel, "pipeline_parallel": running.pipeline_parallel,
        "data_parallel": running.data_parallel, "max_num_seqs": running.max_num_seqs})
    gpu = spec.gpu.model_copy(update={"types": [running.gpu_type]})
    return spec.model_copy(update={"serving": serving, "gpu": gpu})


def _feasible(inputs: PlanInputs) -> tuple[Candidate, ...]:
    try:
        plan = plan_deployment(inputs)
    except PlanningError:
        return ()
    return tuple(c for c in plan.alternatives if c.feasible)


def _words(cost: FleetCost) -> str:
    c = cost.candidate
    return (f"{c.label} at {cost.mean_replicas:.2f} replicas on average (peak {cost.peak_replicas}), "
            f"${cost.cost_per_hour:.2f}/h")


def replan(inputs: PlanInputs, running: Candidate, traffic: ServedTraffic) -> Replan:
    """Price the running configuration and every one the spec allows on the served traffic."""
    spec = inputs.spec
    served = served_spec(spec, traffic)
    base = replace(inputs, spec=served, shape=traffic.shape, efficiency=traffic.efficiency)
    rates = traffic.minute_rates_per_s
    pinned = replace(base, spec=pinned_to(served, running),
                     gpus=tuple(g for g in inputs.gpus if g.name == running.gpu_type))
    current_options = _feasible(pinned)
    current = price_on_traffic(current_options[0], spec, rates) if current_options else None
    options = [price_on_traffic(c, spec, rates) for c in _feasible(base)]
    # Holding the SLOs in more minutes comes first, then the cost; the planner's order breaks ties.
    best = min(options, key=lambda o: (o.minutes_short, round(o.cost_per_hour, 6)), default=None)
    if current is not None and best is not None and (best.minutes_short, round(best.cost_per_hour, 6)) >= (
            current.minutes_short, round(current.cost_per_hour, 6)):
        best = current
    served_words = (f"{len(rates)} min of served traffic (mean {traffic.mean_rate_per_s:.2f} req/s, peak "
                    f"{traffic.peak_rate_per_s:.2f}; {traffic.shape.input_tokens:.0f} prompt / "
                    f"{traffic.shape.output_tokens:.0f} output tokens, {traffic.shape.prefix_cache_hit_rate:.0%} "
                    "prefix-cache hits)")
    if best is None:
        return Replan(current, None, 0.0, f"On {served_words} no configuration the spec allows holds the SLOs.")
    if current is None:
        return Replan(None, best, 0.0, f"On {served_words} the running {running.label} holds no SLO; "
                      f"{_words(best)} does.")
    if best.flags == current.flags:
        return Replan(current, best, 0.0, f"On {served_words} the running configuration is the cheapest: "
                      f"{_words(current)}.")
    savings = 1.0 - best.cost_per_hour / current.cost_per_hour if current.cost_per_hour > 0 else 0.0
    return Replan(current, best, savings,
                  f"On {served_words}: {_words(best)}, against the running {_words(current)}: "
                  f"{savings:.0%} less.")

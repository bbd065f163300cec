"""Re-planning inside a reconcile: when to re-plan on the served traffic, and what status says about it.

The pricing itself is `kvscale.planner.replan` (pure); this module decides when it runs (at most every
spec.scaling.replanIntervalSeconds, sooner when the calibrated request shape moved), builds its input
from what calibration and the forecaster kept, and carries the sustained-saving clock in
status.recommendation, so a restarted operator continues the same window.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from kvscale.api.conditions import format_time
from kvscale.api.spec import LLMDeploymentSpec, ReplanMode
from kvscale.api.status import ConfigurationCostStatus, RecommendationStatus, ServedWorkloadStatus
from kvscale.autoscaler import Calibration
from kvscale.planner.plan import Candidate, serving_flags
from kvscale.planner.replan import FleetCost, Replan, ServedTraffic, replan
from kvscale.planner.search import PlanInputs, planned_shape

# Closed minutes of arrivals before a first re-plan: fewer price a configuration on a moment, not on a
# load (the sustain window, spec.scaling.replanSustainSeconds, is what keeps a moment from recommending).
REPLAN_MIN_MINUTES = 2
# A calibrated mean prompt or output length this far (relative) from the last re-plan's re-plans now.
SHAPE_DRIFT = 0.2


def _drifted(previous: RecommendationStatus, calibration: Calibration) -> bool:
    served = previous.served
    for now_value, then in ((calibration.input_tokens, served.input_tokens),
                            (calibration.output_tokens, served.output_tokens)):
        if now_value is not None and then > 0 and abs(now_value / then - 1.0) > SHAPE_DRIFT:
            return True
    return False


def replan_due(spec: LLMDeploymentSpec, previous: RecommendationStatus | None, calibration: Calibration,
               minutes: int, now: datetime) -> bool:
    """Whether to re-plan in this pass: enabled, the shape learned, enough minutes seen, and either the
    interval passed or the shape moved."""
    if spec.scaling.replan == ReplanMode.OFF or calibration.input_tokens is None or minutes < REPLAN_MIN_MINUTES:
        return False
    if previous is None:
        return True
    elapsed = now - datetime.fromisoformat(previous.evaluated_at)
    return elapsed >= timedelta(seconds=spec.scaling.replan_interval_seconds) or _drifted(previous, calibration)


def history_minutes_needed(spec: LLMDeploymentSpec) -> int:
    """Closed minutes of arrivals a recommendation needs: a configuration priced on part of a day (its
    quiet hours, say) can cost more at the peak it never saw."""
    return max(REPLAN_MIN_MINUTES, -(-spec.scaling.replan_min_history_seconds // 60))


def served_traffic(inputs: PlanInputs, calibration: Calibration, minute_rates_per_s: Sequence[float]) -> ServedTraffic:
    """What calibration measured (shape, speeds, tails) and the day's per-minute arrivals."""
    return ServedTraffic(shape=calibration.shape(planned_shape(inputs.spec)),
                         minute_rates_per_s=tuple(max(r, 0.0) for r in minute_rates_per_s),
                         efficiency=calibration.efficiency(inputs.efficiency),
                         ttft_tail_factor=calibration.ttft_tail_factor, tpot_tail_factor=calibration.tpot_tail_factor)


def _cost_status(cost: FleetCost | None) -> ConfigurationCostStatus | None:
    if cost is None:
        return None
    c = cost.candidate
    return ConfigurationCostStatus(
        gpu_type=c.gpu_type, tensor_parallel=c.tensor_parallel, pipeline_parallel=c.pipeline_parallel,
        data_parallel=c.data_parallel,
        max_num_seqs=c.max_num_seqs, max_model_len=c.max_model_len, gpu_memory_utilization=c.gpu_memory_utilization,
        goodput_requests_per_second=round(c.goodput_requests_per_s, 4), mean_replicas=round(cost.mean_replicas, 3),
        peak_replicas=cost.peak_replicas, cost_per_hour=round(cost.cost_per_hour, 4), minutes_short=cost.minutes_short,
        ttft_ms=None if c.predicted is None else round(c.predicted.ttft_ms, 1),
        tpot_ms=None if c.predicted is None else round(c.predicted.tpot_ms, 2))


def same_configuration(a: ConfigurationCostStatus | None, b: ConfigurationCostStatus | None) -> bool:
    return a is not None and b is not None and serving_flags(a) == serving_flags(b)


def recommendation_status(spec: LLMDeploymentSpec, previous: RecommendationStatus | None, result: Replan,
                          traffic: ServedTraffic, now: datetime) -> RecommendationStatus:
    """Status after a re-plan. A saving of at least replanMinSavings over the same running configuration
    must hold at every re-plan over replanSustainSeconds before the latest proposal is recommended."""
    scaling = spec.scaling
    current, proposed = _cost_status(result.current), _cost_status(result.best)
    cheaper = result.moves and (result.current is None or result.savings >= scaling.replan_min_savings)
    since: str | None = None
    if cheaper:
        # The clock runs while every re-plan finds some configuration that much cheaper than the same
        # running one; which one may change as calibration settles (the latest is the one recommended).
        kept = (previous is not None and previous.cheaper_since is not None
                and (previous.current is None) == (current is None)
                and (current is None or same_configuration(previous.current, current)))
        since = previous.cheaper_since if kept and previous is not None else format_time(now)
    sustain = timedelta(seconds=scaling.replan_sustain_seconds)
    held = since is not None and now - datetime.fromisoformat(since) >= sustain
    minutes, needed = len(traffic.minute_rates_per_s), history_minutes_needed(spec)
    reason = result.reason
    if cheaper and not held:
        reason += (f" Recommended once it holds for {scaling.replan_sustain_seconds} s "
                   f"(spec.scaling.replanSustainSeconds).")
    if cheaper and minutes < needed:
        reason += (f" Recommended only once the served history covers {needed} minutes "
                   f"(spec.scaling.replanMinHistorySeconds); {minutes} so far.")
    elif result.moves and not cheaper:
        reason += f" Below spec.scaling.replanMinSavings ({scaling.replan_min_savings:.0%}): nothing recommended."
    shape = traffic.shape
    return RecommendationStatus(
        evaluated_at=format_time(now),
        served=ServedWorkloadStatus(
            input_tokens=round(shape.input_tokens, 1), output_tokens=round(shape.output_tokens, 1),
            prefix_cache_hit_rate=round(min(max(shape.prefix_cache_hit_rate, 0.0), 1.0), 4),
            requests_per_second=round(traffic.mean_rate_per_s, 4),
            peak_requests_per_second=round(traffic.peak_rate_per_s, 4), minutes=len(traffic.minute_rates_per_s)),
        current=current, proposed=proposed, savings_pct=round(100.0 * result.savings, 1), cheaper_since=since,
        recommended=bool(held) and minutes >= needed, reason=reason)


def replan_status(inputs: PlanInputs, running: Candidate, calibration: Calibration,
                  minute_rates_per_s: Sequence[float], previous: RecommendationStatus | None,
                  now: datetime) -> RecommendationStatus:
    """Re-plan now and fold the answer into status.recommendation."""
    traffic = served_traffic(inputs, calibration, minute_rates_per_s)
    return recommendation_status(inputs.spec, previous, replan(inputs, running, traffic), traffic, now)

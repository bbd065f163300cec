"""Autoscaling inside a reconcile: turn an observation into a calibrated scale decision and status.

The decision itself is `kvscale.autoscaler.decide` (pure, shared with the simulator); this module
only assembles its inputs from the live objects and maps its answer onto status fields and events.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kvscale.api.conditions import ConditionType, format_time, set_condition
from kvscale.api.spec import LLMDeploymentSpec, ScalingMode
from kvscale.api.status import (
    CalibrationStatus,
    ConditionStatus,
    ForecasterErrorStatus,
    ForecastStatus,
    LLMDeploymentStatus,
    ObservedStatus,
    PodStartupStatus,
    ScaleDecisionStatus,
    StartupStatus,
    headline_latency_fields,
)
from kvscale.autoscaler import (
    Calibration,
    Observation,
    ReplicaContext,
    ScaleDecision,
    ScalingHistory,
    calibrate,
    decide,
)
from kvscale.autoscaler.forecast import Forecast, ForecastState
from kvscale.autoscaler.policy import METRICS_MAX_AGE_S, REPLICA_STARTUP_S, build_calibration_sample, forecaster_of
from kvscale.autoscaler.signals import BelowResolution, check_observation
from kvscale.autoscaler.startup import STARTUP_SAMPLES_KEPT, startup_percentile_s
from kvscale.perfmodel.replica import ServingSetup
from kvscale.planner import Candidate
from kvscale.units import (
    bytes_per_s_to_gb_per_s,
    flops_per_s_to_tflops,
    gb_per_s_to_bytes_per_s,
    ms_to_s,
    tflops_to_flops_per_s,
)


@dataclass(frozen=True)
class ScalingInput:
    """What one resync cycle knows for one resource besides its spec and plan."""

    observation: Observation | None
    metrics_problem: str | None  # set when Prometheus itself failed this cycle
    prefill_s: float | None
    history: ScalingHistory
    now_s: float
    bound_pods: Sequence[Mapping[str, Any]] | None = None  # None: unknown, so free GPUs are unknown
    decision_interval_s: float = 30.0  # the resync interval: a scale-up decided now waits at most this


@dataclass(frozen=True)
class ScalingResult:
    decision: ScaleDecision
    replicas: int  # what the Deployment should run (unchanged in Recommend mode)
    status: LLMDeploymentStatus


def previous_calibration(status: LLMDeploymentStatus | None) -> Calibration:
    """The calibration the last cycle (or the last operator, before a restart) left in status."""
    if status is None or status.calibration is None:
        return Calibration()
    c = status.calibration
    return Calibration(decode_factor=c.decode_factor, prefill_factor=c.prefill_factor,
                       tpot_tail_factor=c.tpot_tail_factor or 1.0, ttft_tail_factor=c.ttft_tail_factor or 1.0,
                       tpot_error_pct=c.tpot_error_pct, ttft_error_pct=c.ttft_error_pct,
                       samples=1 if c.fitted_windows is None else c.fitted_windows,  # None: written before it existed
                       input_tokens=c.input_tokens, output_tokens=c.output_tokens,
                       input_tokens_tail=c.input_tokens_tail, prefix_cache_hit_rate=c.prefix_cache_hit_rate,
                       shape_requests=c.shape_requests, speed_fit_from=c.speed_fit_from,
                       achieved_hbm_bandwidth_bytes_per_s=_converted(c.achieved_hbm_bandwidth_gbps,
                                                                     gb_per_s_to_bytes_per_s),
                       achieved_flops_per_s=_converted(c.achieved_tflops, tflops_to_flops_per_s))


def _converted(value: float | None, convert: Callable[[float], float]) -> float | None:
    return None if value is None else convert(value)


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def calibration_status(calibration: Calibration) -> CalibrationStatus:
    """The calibration as status; `previous_calibration` reads it back for the next cycle."""
    return CalibrationStatus(
        decode_factor=round(calibration.decode_factor, 4), prefill_factor=round(calibration.prefill_factor, 4),
        tpot_tail_factor=round(calibration.tpot_tail_factor, 4),
        ttft_tail_factor=round(calibration.ttft_tail_factor, 4),
        ttft_error_pct=_rounded(calibration.ttft_error_pct, 1),
        tpot_error_pct=_rounded(calibration.tpot_error_pct, 1),
        input_tokens=_rounded(calibration.input_tokens, 1), output_tokens=_rounded(calibration.output_tokens, 1),
        input_tokens_tail=_rounded(calibration.input_tokens_tail, 1), fitted_windows=calibration.samples,
        prefix_cache_hit_rate=_rounded(calibration.prefix_cache_hit_rate, 4),
        shape_requests=_rounded(calibration.shape_requests, 1), speed_fit_from=calibration.speed_fit_from,
        achieved_hbm_bandwidth_gbps=_rounded(_converted(calibration.achieved_hbm_bandwidth_bytes_per_s,
                                                        bytes_per_s_to_gb_per_s), 1),
        achieved_tflops=_rounded(_converted(calibration.achieved_flops_per_s, flops_per_s_to_tflops), 3))


def startup_status(previous: StartupStatus | None, measured: Sequence[tuple[str, float]]) -> StartupStatus | None:
    """The recent start-ups: those status already holds (a pod's first measurement stands; a restarted
    operator keeps them), then the pods seen Ready for the first time, the last STARTUP_SAMPLES_KEPT."""
    recent = list(previous.recent) if previous is not None else []
    known = {p.pod for p in recent}
    recent += [PodStartupStatus(pod=name, seconds=round(seconds, 1)) for name, seconds in measured if name not in known]
    recent = recent[-STARTUP_SAMPLES_KEPT:]
    if not recent:
        return None
    p90 = startup_percentile_s([p.seconds for p in recent], REPLICA_STARTUP_S)
    return StartupStatus(p90_seconds=round(p90, 1), recent=recent)


def forecast_status(forecast: Forecast, forecasts: ForecastState) -> ForecastStatus:
    return ForecastStatus(
        forecaster=forecast.forecaster.value, horizon_seconds=round(forecast.horizon_s, 1),
        requests_per_second=round(max(forecast.arrivals_per_s, 0.0), 3),
        backtest_error_pct=_rounded(forecast.backtest_error_pct, 1), scored_minutes=forecast.scored_buckets,
        backtest=[ForecasterErrorStatus(forecaster=f.value, error_pct=_rounded(e, 1))
                  for f, e in forecasts.backtest().items()])


def _observed_status(spec: LLMDeploymentSpec, observation: Observation) -> ObservedStatus:
    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000.0, 2)

    usage = observation.kv_cache_usage
    missed = observation.missed_slo_share(ms_to_s(spec.slo.ttft_ms), ms_to_s(spec.slo.tpot_ms))
    return ObservedStatus(
        ttft_at_slo_percentile_ms=ms(observation.ttft_s),
        tpot_at_slo_percentile_ms=ms(observation.tpot_s),
        ttft_p95_ms=ms(observation.ttft_s),  # deprecated names of the same values (ObservedStatus)
        tpot_p95_ms=ms(observation.tpot_s),
        requests_per_second=None if observation.request_rate is None else round(observation.request_rate, 3),
        kv_cache_usage=None if usage is None else round(min(max(usage, 0.0), 1.0), 3),
        running_requests=_rounded(observation.running_requests, 3),
        waiting_requests=_rounded(observation.waiting_requests, 3),
        aborted_per_second=_rounded(observation.aborted_rate, 3),
        failed_per_second=_rounded(observation.failed_rate, 3),
        tpot_mean_ms=ms(observation.tpot_mean_s),
        prefix_cache_hit_rate=_rounded(observation.prefix_cache_hit_rate, 4),
        within_slo_pct=None if missed is None else round(100.0 * (1.0 - missed), 2),
        below_resolution=[_below_text(b) for b in observation.below_resolution] or None,
        sampled_at=format_time(datetime.fromtimestamp(observation.sampled_at_s, UTC)),
    )


_BELOW_NAMES = {"ttft_s": ("TTFT", "ms"), "tpot_s": ("TPOT", "ms"), "prefill_quantile_s": ("prefill time", "ms"),
                "input_tokens_quantile": ("prompt length", "tokens")}


def _below_text(below: BelowResolution) -> str:
    name, unit = _BELOW_NAMES.get(below.signal, (below.signal, ""))
    bound = below.at_most * 1000.0 if unit == "ms" else below.at_most
    return f"{name} <= {bound:g} {unit} (the histogram's first bucket)"


def _slo_met(spec: LLMDeploymentSpec, observation: Observation) -> bool | None:
    """Whether the percentiles met the SLOs; a percentile in its first bucket meets an SLO at or above
    that bucket's bound, and says nothing of a tighter one."""
    checks = []
    for value, signal, slo_ms in ((observation.ttft_s, "ttft_s", spec.slo.ttft_ms),
                                  (observation.tpot_s, "tpot_s", spec.slo.tpot_ms)):
        bound = observation.bound_of(signal)
        if value is not None:
            checks.append(value * 1000.0 <= slo_ms)
        elif bound is not None and bound * 1000.0 <= slo_ms:
            checks.append(True)
    return all(checks) if checks else None


def autoscale(spec: LLMDeploymentSpec, setup: ServingSetup, chosen: Candidate, status: LLMDeploymentStatus,
              previous: LLMDeploymentStatus | None, current_replicas: int, ready_replicas: int,
              free_replica_slots: int | None, scaling: ScalingInput, now: datetime,
              startups: Sequence[tuple[str, float]] = ()) -> ScalingResult:
    """Calibrate on the observation, ask the policy, and fold the answer into the status. `startups`:
    (pod, seconds from creation to Ready) of the deployment's Ready pods."""
    generation = status.observed_generation
    observation = scaling.observation
    problem = scaling.metrics_problem or check_observation(observation, scaling.now_s, METRICS_MAX_AGE_S)
    calibration = previous_calibration(previous)
    startup = startup_status(previous.startup if previous is not None else None, startups)
    context = ReplicaContext(spec=spec, setup=setup, max_num_seqs=setup.replica_max_num_seqs(chosen.max_num_seqs),
                             kv_cache_tokens=chosen.kv_cache_tokens, current_replicas=current_replicas,
                             ready_replicas=ready_replicas, free_replica_slots=free_replica_slots,
                             calibration=calibration,
                             startup_s=startup.p90_seconds if startup is not None else REPLICA_STARTUP_S,
                             decision_interval_s=scaling.decision_interval_s, forecaster=forecaster_of(spec))
    if problem is None and observation is not None:
        sample = build_calibration_sample(context, observation, prefill_mean_s=scaling.prefill_s)
        context = replace(context, calibration=calibrate(calibration, setup, sample))
        calibration = context.calibration
    decision = decide(None if scaling.metrics_problem else observation, context, scaling.history, scaling.now_s)

    conditions = status.conditions
    updates: dict[str, Any] = {}
    if decision.metrics_problem:
        cause = scaling.metrics_problem or decision.metrics_problem  # Prometheus's own failure, when it failed
        conditions = set_condition(conditions, ConditionType.METRICS_UNAVAILABLE, ConditionStatus.TRUE,
                                   "NoUsableMetrics", f"{cause}; replicas held at "
                                   f"{current_replicas}, never scaled down without metrics.", now, generation)
    else:
        conditions = set_condition(conditions, ConditionType.METRICS_UNAVAILABLE, ConditionStatus.FALSE,
                                   "MetricsFresh", "vLLM metrics are being scraped.", now, generation)
        assert observation is not None
        updates["observed"] = _observed_status(spec, observation)
        updates["slo_met"] = _slo_met(spec, observation)
    if calibration.samples or calibration.input_tokens is not None:
        updates["calibration"] = calibration_status(calibration)
    auto = spec.scaling.mode == ScalingMode.AUTO
    target = decision.desired_replicas if auto else current_replicas
    last = previous.last_scale_decision if previous else None
    proposal = decision.desired_replicas
    if proposal != current_replicas and (last is None or last.to_replicas != proposal or not auto):
        updates["last_scale_decision"] = ScaleDecisionStatus(
            time=format_time(now), from_replicas=current_replicas, to_replicas=proposal,
            reason=("" if auto else "recommended (mode Recommend, not applied): ") + decision.reason)
    updates["desired_replicas"] = target
    updates["conditions"] = conditions
    updates["startup"] = startup
    if decision.forecast is not None:
        updates["forecast"] = forecast_status(decision.forecast, decision.history.forecasts)
    new_status = status.model_copy(update=updates)
    if new_status.observed is not None:
        new_status = new_status.model_copy(update=headline_latency_fields(
            new_status.observed.ttft_ms if new_status.observed.ttft_ms is not None
            else new_status.ttft_at_slo_percentile_ms,
            new_status.observed.tpot_ms if new_status.observed.tpot_ms is not None
            else new_status.tpot_at_slo_percentile_ms))
    return ScalingResult(decision=decision, replicas=target, status=new_status)

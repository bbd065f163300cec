"""Re-planning on the served traffic (issue 17, Recommend): pricing, the sustained-saving clock, and the pass."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kvscale.api.spec import parse_spec
from kvscale.api.status import CalibrationStatus, LLMDeploymentStatus
from kvscale.autoscaler import Calibration, ScalingHistory
from kvscale.autoscaler.forecast import ForecastState
from kvscale.controllers.autoscaling import ScalingInput
from kvscale.controllers.desire import desire, plan_cached
from kvscale.controllers.replanning import REPLAN_MIN_MINUTES, replan_due, replan_status
from kvscale.controllers.world import World
from kvscale.kube.builders import Owner, build_deployment, build_service
from kvscale.perfmodel.efficiency import DEFAULT_EFFICIENCY
from kvscale.perfmodel.serving import RequestShape
from kvscale.planner.replan import ServedTraffic, price_on_traffic, replan

T0 = datetime(2026, 3, 2, 9, 0, 0, tzinfo=UTC)
UID = "0b8e2c6a-0000-4000-8000-0000000000aa"
OWNER = Owner(name="llama-8b", namespace="team-a", uid=UID)


def spec_dict(**scaling: Any) -> dict[str, Any]:
    """Llama-3.1-8B declared for 1,024/256 tokens at 2 req/s, on H100 or L4 (the planner picks 4 x L4)."""
    return {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "precision": "bf16"},
            "gpu": {"types": ["H100-SXM", "L4"], "perNode": 8},
            "slo": {"ttftMs": 2500, "tpotMs": 50, "percentile": 95},
            "workload": {"requestsPerSecond": 2, "inputTokens": 1024, "outputTokens": 256, "maxContextTokens": 8192},
            "scaling": {"minReplicas": 1, "maxReplicas": 8, **scaling}}


SPEC = parse_spec(spec_dict())
INPUTS, PLAN = plan_cached(SPEC, None, {})
RUNNING = PLAN.chosen
assert RUNNING is not None


def traffic(input_tokens: float, output_tokens: float, rates: tuple[float, ...]) -> ServedTraffic:
    shape = RequestShape.with_assumed_tail(input_tokens, output_tokens, 0.95, 8192 - output_tokens)
    return ServedTraffic(shape=shape, minute_rates_per_s=rates, efficiency=DEFAULT_EFFICIENCY)


LONG_PROMPTS = traffic(6000, 150, (1.0,) * 20)
AS_DECLARED = traffic(1024, 256, (2.0,) * 20)


def test_the_declared_workload_plans_small_gpus() -> None:
    assert RUNNING is not None and (RUNNING.gpu_type, RUNNING.tensor_parallel) == ("L4", 4)


def test_long_prompts_make_another_configuration_cheaper_and_say_why() -> None:
    assert RUNNING is not None
    result = replan(INPUTS, RUNNING, LONG_PROMPTS)
    assert result.current is not None and result.best is not None and result.moves
    # 6,000-token prompts on four L4s miss the TTFT SLO but at a trickle, so the L4 fleet needs more replicas.
    assert result.current.candidate.gpu_type == "L4" and result.current.mean_replicas > 1
    assert result.best.flags != result.current.flags
    assert result.best.cost_per_hour < result.current.cost_per_hour
    assert result.savings == pytest.approx(1 - result.best.cost_per_hour / result.current.cost_per_hour)
    assert result.savings > 0.15
    assert "less" in result.reason and "6000 prompt / 150 output" in result.reason


def test_the_declared_traffic_keeps_the_running_configuration() -> None:
    assert RUNNING is not None
    result = replan(INPUTS, RUNNING, AS_DECLARED)
    assert not result.moves and result.savings == 0.0
    assert "running configuration is the cheapest" in result.reason


def test_a_fleet_is_priced_minute_by_minute_within_the_bounds() -> None:
    assert RUNNING is not None
    per_replica = RUNNING.goodput_requests_per_s
    # a quiet minute (the floor of 1), one at two replicas' worth, one beyond maxReplicas (8)
    rates = (0.0, 2 * per_replica / 1.1, 20 * per_replica)
    cost = price_on_traffic(RUNNING, SPEC, rates)
    assert cost.peak_replicas == 8 and cost.minutes_short == 1
    assert cost.mean_replicas == pytest.approx((1 + 2 + 8) / 3)
    assert cost.cost_per_hour == pytest.approx(cost.mean_replicas * RUNNING.gpus_per_replica * RUNNING.usd_per_gpu_hour)
    # Going down, the replicas stay at the highest of the scale-down stabilization window (300 s: 5 minutes).
    falling = price_on_traffic(RUNNING, SPEC, (20 * per_replica,) + (0.0,) * 9)
    assert falling.mean_replicas == pytest.approx((8 * 6 + 1 * 4) / 10)


def calibration(input_tokens: float = 6000.0, output_tokens: float = 150.0) -> Calibration:
    return Calibration(samples=10, input_tokens=input_tokens, output_tokens=output_tokens)


def test_the_saving_is_recommended_only_once_it_has_held_for_the_window() -> None:
    spec = parse_spec(spec_dict(replanSustainSeconds=600, replanMinHistorySeconds=600))
    inputs, _ = plan_cached(spec, None, {})
    assert RUNNING is not None
    rates = (1.0,) * 20
    first = replan_status(inputs, RUNNING, calibration(), rates, None, T0)
    assert first.proposed is not None and first.current is not None
    assert first.savings_pct > 15 and first.cheaper_since is not None and not first.recommended
    assert "Recommended once it holds for 600 s" in first.reason
    later = replan_status(inputs, RUNNING, calibration(), rates, first, T0 + timedelta(seconds=300))
    assert later.cheaper_since == first.cheaper_since and not later.recommended
    held = replan_status(inputs, RUNNING, calibration(), rates, later, T0 + timedelta(seconds=600))
    assert held.recommended and held.cheaper_since == first.cheaper_since
    # The traffic returns to what was declared: nothing is cheaper any more, and the clock stops.
    back = replan_status(inputs, RUNNING, calibration(1024, 256), (2.0,) * 20, held, T0 + timedelta(seconds=900))
    assert not back.recommended and back.cheaper_since is None and back.savings_pct == 0


def test_nothing_is_recommended_before_the_history_covers_the_stated_span() -> None:
    # Priced on part of a day, a configuration sized for its quiet hours can lose at the peak it never saw.
    spec = parse_spec(spec_dict(replanSustainSeconds=0, replanMinHistorySeconds=3600))
    inputs, _ = plan_cached(spec, None, {})
    assert RUNNING is not None
    early = replan_status(inputs, RUNNING, calibration(), (1.0,) * 59, None, T0)
    assert early.savings_pct > 15 and early.cheaper_since is not None and not early.recommended
    assert "covers 60 minutes (spec.scaling.replanMinHistorySeconds); 59 so far" in early.reason
    covered = replan_status(inputs, RUNNING, calibration(), (1.0,) * 60, early, T0 + timedelta(seconds=60))
    assert covered.recommended and covered.cheaper_since == early.cheaper_since
    assert parse_spec(spec_dict()).scaling.replan_min_history_seconds == 86_400  # a whole day by default


def test_a_saving_below_the_threshold_is_reported_not_recommended() -> None:
    spec = parse_spec(spec_dict(replanMinSavings=0.9, replanSustainSeconds=0))
    inputs, _ = plan_cached(spec, None, {})
    assert RUNNING is not None
    status = replan_status(inputs, RUNNING, calibration(), (1.0,) * 20, None, T0)
    assert status.proposed is not None and 15 < status.savings_pct < 90
    assert not status.recommended and status.cheaper_since is None and "replanMinSavings (90%)" in status.reason


def test_a_replan_is_due_on_the_interval_or_when_the_shape_moves() -> None:
    spec = parse_spec(spec_dict(replanIntervalSeconds=300))
    assert RUNNING is not None
    assert not replan_due(spec, None, Calibration(), 30, T0)  # nothing learned yet
    assert not replan_due(spec, None, calibration(), REPLAN_MIN_MINUTES - 1, T0)
    assert replan_due(spec, None, calibration(), REPLAN_MIN_MINUTES, T0)
    done = replan_status(INPUTS, RUNNING, calibration(), (1.0,) * 20, None, T0)
    assert not replan_due(spec, done, calibration(6500, 150), 20, T0 + timedelta(seconds=60))
    assert replan_due(spec, done, calibration(8000, 150), 20, T0 + timedelta(seconds=60))  # +33% prompts
    assert replan_due(spec, done, calibration(), 20, T0 + timedelta(seconds=300))
    off = parse_spec(spec_dict(replan="Off"))
    assert not replan_due(off, None, calibration(), 30, T0)


def world_after(previous: LLMDeploymentStatus, minutes: int, now: datetime, spec: dict[str, Any]) -> World:
    parsed = parse_spec(spec)
    inputs, plan = plan_cached(parsed, None, {})
    assert plan.chosen is not None
    gpu = next(g for g in inputs.gpus if g.name == plan.chosen.gpu_type)
    deployment = build_deployment(OWNER, parsed, plan.chosen, 1, gpu=gpu, native_precision=inputs.arch.native_precision)
    deployment["status"] = {"replicas": 1, "readyReplicas": 1}
    forecasts = ForecastState()
    for minute in range(minutes + 1):
        forecasts = forecasts.observe(now.timestamp() - 60.0 * (minutes - minute), 1.0)
    history = replace(ScalingHistory(), forecasts=forecasts)
    scaling = ScalingInput(observation=None, metrics_problem=None, prefill_s=None, history=history,
                           now_s=now.timestamp(), bound_pods=None)
    body = {"apiVersion": "kvscale.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": OWNER.name, "namespace": OWNER.namespace, "uid": UID, "generation": 1},
            "spec": spec, "status": previous.model_dump(by_alias=True, exclude_none=True, mode="json")}
    return World(body=body, deployment=deployment, service=build_service(OWNER, parsed), nodes=(), config_map=None,
                 now=now, scaling=scaling)


def test_the_reconcile_pass_reports_the_recommendation_once_and_changes_nothing() -> None:
    spec = spec_dict(replanSustainSeconds=60, replanIntervalSeconds=30, replanMinHistorySeconds=600)
    status = LLMDeploymentStatus(observed_generation=1, calibration=CalibrationStatus(
        decode_factor=1.0, prefill_factor=1.0, tpot_tail_factor=1.0, ttft_tail_factor=1.0, fitted_windows=10,
        input_tokens=6000.0, output_tokens=150.0))
    events: list[str] = []
    writes = []
    for step in range(4):
        intent = desire(world_after(status, 10 + step, T0 + timedelta(seconds=30 * step), spec), {})
        status = intent.status
        events += [e.reason for e in intent.events if e.reason == "ReplanRecommended"]
        writes += [w for w in intent.writes if w.kind.value == "Deployment"]
    rec = status.recommendation
    assert rec is not None and rec.recommended and rec.proposed is not None and rec.current is not None
    assert (rec.current.gpu_type, rec.current.tensor_parallel) == ("L4", 4)
    assert (rec.proposed.gpu_type, rec.proposed.tensor_parallel) != ("L4", 4)
    assert rec.served.minutes >= 10 and rec.served.input_tokens == 6000
    assert events == ["ReplanRecommended"]  # once, when it became recommended
    assert not writes  # Recommend: the running Deployment is left as it is


def test_what_the_spec_pins_stays_pinned_in_every_proposal() -> None:
    spec = parse_spec({**spec_dict(), "serving": {"tensorParallel": 4}})
    inputs, plan = plan_cached(spec, None, {})
    assert plan.chosen is not None and plan.chosen.tensor_parallel == 4
    result = replan(inputs, plan.chosen, LONG_PROMPTS)
    assert result.best is not None and result.best.candidate.tensor_parallel == 4

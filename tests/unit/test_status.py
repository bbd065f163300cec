"""Status models and condition helpers: transitions, and the status a plan produces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from kvscale.api.conditions import (
    ConditionType,
    Reason,
    build_status_from_plan,
    find_condition,
    format_time,
    is_condition_true,
    set_condition,
)
from kvscale.api.spec import LLMDeploymentSpec, load_resource
from kvscale.api.status import (
    Condition,
    ConditionStatus,
    LLMDeploymentStatus,
    ObservedStatus,
    PredictedStatus,
    headline_latencies_ms,
)
from kvscale.planner import Plan, build_plan_inputs, plan_deployment

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
T2 = T0 + timedelta(minutes=10)


@pytest.fixture(scope="module")
def spec() -> LLMDeploymentSpec:
    return load_resource(ROOT / "examples" / "llama-3.1-70b-h100.yaml").spec


@pytest.fixture(scope="module")
def feasible_plan(spec: LLMDeploymentSpec) -> Plan:
    plan = plan_deployment(build_plan_inputs(spec))
    assert plan.feasible
    return plan


@pytest.fixture(scope="module")
def infeasible_plan(spec: LLMDeploymentSpec) -> Plan:
    unreachable = spec.model_copy(update={"slo": spec.slo.model_copy(update={"tpot_ms": 0.5})})
    plan = plan_deployment(build_plan_inputs(unreachable))
    assert not plan.feasible
    return plan


# --- conditions ---------------------------------------------------------------------------


def test_format_time_is_rfc3339_utc_seconds() -> None:
    assert format_time(T0) == "2025-03-01T12:00:00Z"
    assert format_time(datetime(2025, 3, 1, 14, 0, 0, 999, tzinfo=timezone(timedelta(hours=2)))) == (
        "2025-03-01T12:00:00Z"
    )
    with pytest.raises(ValueError, match="timezone-aware"):
        format_time(datetime(2025, 3, 1))  # naive on purpose


def test_set_condition_appends_a_new_type() -> None:
    conditions = set_condition([], ConditionType.PLANNED, ConditionStatus.TRUE, "PlanFound", "ok", T0, 1)
    assert conditions == [
        Condition(type="Planned", status=ConditionStatus.TRUE, reason="PlanFound", message="ok",
                  last_transition_time="2025-03-01T12:00:00Z", observed_generation=1)
    ]


def test_transition_time_moves_only_when_status_flips() -> None:
    first = set_condition([], "Ready", ConditionStatus.FALSE, "Starting", "0/2 ready", T0, 1)
    same = set_condition(first, "Ready", ConditionStatus.FALSE, "Loading", "1/2 ready", T1, 2)
    [kept] = same
    assert kept.last_transition_time == format_time(T0)
    assert (kept.reason, kept.message, kept.observed_generation) == ("Loading", "1/2 ready", 2)
    flipped = set_condition(same, "Ready", ConditionStatus.TRUE, "AllReplicasReady", "2/2 ready", T2, 2)
    assert flipped[0].last_transition_time == format_time(T2)
    assert flipped[0].status == ConditionStatus.TRUE


def test_set_condition_is_pure_and_keeps_order() -> None:
    conditions = set_condition([], "Planned", ConditionStatus.TRUE, "PlanFound", "", T0, 1)
    conditions = set_condition(conditions, "Ready", ConditionStatus.FALSE, "Starting", "", T0, 1)
    before = list(conditions)
    after = set_condition(conditions, "Planned", ConditionStatus.FALSE, "NoFeasiblePlan", "", T1, 2)
    assert conditions == before  # the input is not modified
    assert [c.type for c in after] == ["Planned", "Ready"]
    assert find_condition(after, "Ready") == before[1]
    assert not is_condition_true(after, "Planned")
    assert is_condition_true(conditions, "Planned")
    assert find_condition(after, "Infeasible") is None


def test_long_messages_are_clipped_to_the_api_limit() -> None:
    [condition] = set_condition([], "Planned", ConditionStatus.TRUE, "PlanFound", "x" * 40_000, T0, 1)
    assert len(condition.message) == 32768 and condition.message.endswith("...")


def test_condition_fields_follow_the_api_conventions() -> None:
    with pytest.raises(ValidationError):
        Condition(type="Planned", status="Maybe", reason="PlanFound", last_transition_time="2025-03-01T12:00:00Z")
    with pytest.raises(ValidationError):
        Condition(type="Planned", status=ConditionStatus.TRUE, reason="not camel case!",
                  last_transition_time="2025-03-01T12:00:00Z")
    with pytest.raises(ValidationError):
        Condition(type="Planned", status=ConditionStatus.TRUE, reason="PlanFound", last_transition_time="yesterday")
    with pytest.raises(ValidationError):
        Condition(type="Planned", status=ConditionStatus.TRUE, reason="PlanFound",
                  last_transition_time="2025-03-01T12:00:00")  # no zone


def test_condition_type_constants() -> None:
    assert [t.value for t in ConditionType] == [
        "Planned", "Ready", "Infeasible", "InsufficientCapacity", "MetricsUnavailable", "InvalidSpec",
    ]


# --- status from a plan -------------------------------------------------------------------


def test_status_from_a_feasible_plan(feasible_plan: Plan) -> None:
    chosen = feasible_plan.chosen
    assert chosen is not None and chosen.predicted is not None
    status = build_status_from_plan(feasible_plan, generation=3, now=T0)
    assert status.observed_generation == 3
    plan = status.plan
    assert plan is not None and plan.feasible
    assert (plan.gpu_type, plan.tensor_parallel, plan.max_num_seqs, plan.max_model_len) == (
        chosen.gpu_type, chosen.tensor_parallel, chosen.max_num_seqs, chosen.max_model_len,
    )
    assert (plan.replicas, plan.gpus) == (chosen.replicas, chosen.gpus)
    assert plan.cost_per_hour == pytest.approx(chosen.cost_per_hour, abs=1e-3)
    assert plan.binding_constraint == feasible_plan.binding_constraint
    assert plan.explanation == feasible_plan.explanation
    assert status.predicted is not None
    assert status.predicted.ttft_ms == pytest.approx(chosen.predicted.ttft_ms, abs=0.01)
    assert status.predicted.tpot_ms == pytest.approx(chosen.predicted.tpot_ms, abs=0.001)
    assert status.desired_replicas == chosen.replicas
    # Before any metrics the printer columns show the prediction.
    assert (status.ttft_p95_ms, status.tpot_p95_ms) == (status.predicted.ttft_ms, status.predicted.tpot_ms)
    planned = find_condition(status.conditions, ConditionType.PLANNED)
    infeasible = find_condition(status.conditions, ConditionType.INFEASIBLE)
    assert planned is not None and infeasible is not None
    assert (planned.status, planned.reason, planned.message) == (
        ConditionStatus.TRUE, Reason.PLAN_FOUND, feasible_plan.explanation,
    )
    assert infeasible.status == ConditionStatus.FALSE
    assert planned.observed_generation == infeasible.observed_generation == 3


def test_status_from_an_infeasible_plan(infeasible_plan: Plan) -> None:
    status = build_status_from_plan(infeasible_plan, generation=1, now=T0)
    assert status.plan is not None and not status.plan.feasible
    assert status.plan.gpu_type is None and status.plan.replicas == 0
    assert status.predicted is None and status.desired_replicas is None
    assert status.ttft_p95_ms is None
    planned = find_condition(status.conditions, ConditionType.PLANNED)
    infeasible = find_condition(status.conditions, ConditionType.INFEASIBLE)
    assert planned is not None and planned.status == ConditionStatus.FALSE
    assert planned.reason == Reason.NO_FEASIBLE_PLAN
    assert infeasible is not None and infeasible.status == ConditionStatus.TRUE
    assert infeasible.reason == Reason.TPOT_UNREACHABLE  # binding constraint "tpot"
    assert infeasible.message == infeasible_plan.explanation
    assert "TPOT" in infeasible.message


def test_replanning_keeps_what_was_learned_elsewhere(feasible_plan: Plan, infeasible_plan: Plan) -> None:
    observed = ObservedStatus(ttft_p95_ms=500.0, tpot_p95_ms=None, sampled_at="2025-03-01T12:01:00Z")
    first = build_status_from_plan(feasible_plan, generation=1, now=T0)
    ready = set_condition(first.conditions, ConditionType.READY, ConditionStatus.TRUE, "AllReplicasReady", "",
                          T0, 1)
    running = LLMDeploymentStatus.model_validate(
        {**dict(first), "observed": observed, "replicas": 2, "ready_replicas": 2, "selector": "a=b",
         "conditions": ready}
    )
    again = build_status_from_plan(feasible_plan, generation=2, now=T1, previous=running)
    assert (again.observed, again.replicas, again.ready_replicas, again.selector) == (observed, 2, 2, "a=b")
    assert again.ttft_p95_ms == 500.0  # observed wins
    assert again.predicted is not None and again.tpot_p95_ms == again.predicted.tpot_ms  # falls back
    planned = find_condition(again.conditions, ConditionType.PLANNED)
    assert planned is not None and planned.last_transition_time == format_time(T0)  # no flip
    assert planned.observed_generation == 2
    assert is_condition_true(again.conditions, ConditionType.READY)

    broken = build_status_from_plan(infeasible_plan, generation=3, now=T2, previous=again)
    planned = find_condition(broken.conditions, ConditionType.PLANNED)
    assert planned is not None and planned.last_transition_time == format_time(T2)  # flipped
    assert [c.type for c in broken.conditions] == ["Planned", "Infeasible", "Ready"]


def test_headline_latencies_prefer_observed() -> None:
    predicted = PredictedStatus(ttft_ms=300, tpot_ms=30, output_tokens_per_s=1, output_tokens_per_s_per_gpu=1)
    observed = ObservedStatus(ttft_p95_ms=400, tpot_p95_ms=None, sampled_at="2025-03-01T12:00:00Z")
    assert headline_latencies_ms(None, None) == (None, None)
    assert headline_latencies_ms(None, predicted) == (300, 30)
    assert headline_latencies_ms(observed, predicted) == (400, 30)


def test_status_serializes_camel_case_and_reads_back_with_unknown_fields(feasible_plan: Plan) -> None:
    status = build_status_from_plan(feasible_plan, generation=1, now=T0)
    wire = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert {"observedGeneration", "desiredReplicas", "ttftP95Ms", "conditions"} <= set(wire)
    assert wire["plan"]["gpuType"] == "H100-SXM"
    assert wire["conditions"][0]["lastTransitionTime"] == "2025-03-01T12:00:00Z"
    assert "phase" not in LLMDeploymentStatus.model_fields
    # kopf keeps its own bookkeeping in status.kopf; reading the status back must not fail on it.
    read_back = LLMDeploymentStatus.model_validate({**wire, "kopf": {"progress": {}}})
    assert read_back == status

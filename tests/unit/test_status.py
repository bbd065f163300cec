"""Status models and condition helpers: transitions, and the status a plan produces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from kvscale.api.conditions import (
    ConditionType,
    find_condition,
    format_time,
    is_condition_true,
    set_condition,
)
from kvscale.api.status import (
    Condition,
    ConditionStatus,
    ObservedStatus,
    PredictedStatus,
    headline_latencies_ms,
)

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
T2 = T0 + timedelta(minutes=10)


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
        "Planned", "Ready", "Infeasible", "InsufficientCapacity", "MetricsUnavailable", "InvalidSpec", "WriteFailed",
    ]


# --- the status of a whole pass is tested in test_desire.py ---------------------------------


def test_headline_latencies_prefer_observed() -> None:
    predicted = PredictedStatus(ttft_ms=300, tpot_ms=30, output_tokens_per_s=1, output_tokens_per_s_per_gpu=1)
    observed = ObservedStatus(ttft_at_slo_percentile_ms=400, tpot_at_slo_percentile_ms=None,
                              sampled_at="2025-03-01T12:00:00Z")
    assert headline_latencies_ms(None, None) == (None, None)
    assert headline_latencies_ms(None, predicted) == (300, 30)
    assert headline_latencies_ms(observed, predicted) == (400, 30)


def test_observed_latencies_written_by_an_older_operator_still_read() -> None:
    """A status an older operator wrote holds only the deprecated ttftP95Ms / tpotP95Ms: they are read as the
    latencies at the SLO percentile, which they always were."""
    older = ObservedStatus.model_validate({"ttftP95Ms": 410.0, "tpotP95Ms": 41.0, "sampledAt": "2025-03-01T12:00:00Z"})
    assert (older.ttft_ms, older.tpot_ms) == (410.0, 41.0)
    newer = ObservedStatus.model_validate({"ttftAtSloPercentileMs": 420.0, "ttftP95Ms": 410.0,
                                           "sampledAt": "2025-03-01T12:00:00Z"})
    assert newer.ttft_ms == 420.0 and newer.tpot_ms is None



"""Which per-pod loads a scale-down ranks its pods by: the last resync's, while fresh enough."""

import time

from kvscale.controllers.operator import IN_FLIGHT_MIN_AGE_S, OperatorConfig, OperatorState


def test_loads_rank_a_scale_down_for_two_intervals_and_at_least_half_a_minute() -> None:
    # Production's 30-s interval: two intervals. The bed's 2-s one: a pass on a loaded control plane takes
    # longer than two, so the floor keeps the last figures (a count of requests that last tens of seconds).
    assert OperatorConfig(scan_interval_s=30.0).in_flight_max_age_s == 60.0
    assert OperatorConfig(scan_interval_s=2.0).in_flight_max_age_s == IN_FLIGHT_MIN_AGE_S
    state = OperatorState(OperatorConfig(scan_interval_s=2.0))
    key = ("ns", "llm")
    assert state._in_flight(key) is None  # never read: the ReplicaSet picks
    state.in_flight[key] = (time.monotonic() - 10.0, {"pod-a": 3.0})  # five intervals old, within the floor
    assert state._in_flight(key) == {"pod-a": 3.0}
    state.in_flight[key] = (time.monotonic() - IN_FLIGHT_MIN_AGE_S - 1.0, {"pod-a": 3.0})
    assert state._in_flight(key) is None

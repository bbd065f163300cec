"""Replica start-up measured on the deployment's own pods, kept in status, and used as the horizon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvscale.api.spec import load_resource
from kvscale.api.status import LLMDeploymentStatus
from kvscale.autoscaler.startup import STARTUP_SAMPLES_KEPT, startup_percentile_s
from kvscale.controllers.autoscaling import startup_status
from kvscale.kube.state import pod_startups
from kvscale.planner import build_plan_inputs
from kvscale.sim import FleetConfig, build_simulated_deployment, generate_synthetic_trace, simulate
from kvscale.sim.policies import StaticPolicy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-3.1-8b-l4.yaml"
SELECTOR = {"kvscale.dev/llmdeployment": "chat"}


def _pod(name: str, created: str, ready_at: str | None, namespace: str = "team", ready: bool = True,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    conditions = [] if ready_at is None else [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ready_at}]
    return {"metadata": {"name": name, "namespace": namespace, "creationTimestamp": created,
                         "labels": SELECTOR if labels is None else labels},
            "status": {"conditions": conditions}}


def test_pod_startups_are_creation_to_ready_of_the_selected_ready_pods_in_ready_order() -> None:
    pods = [
        _pod("chat-b", "2026-11-24T10:00:00Z", "2026-11-24T10:03:30Z"),
        _pod("chat-a", "2026-11-24T10:00:00Z", "2026-11-24T10:01:40Z"),
        _pod("chat-starting", "2026-11-24T10:00:00Z", None),
        _pod("chat-unready", "2026-11-24T10:00:00Z", "2026-11-24T10:02:00Z", ready=False),
        _pod("other", "2026-11-24T10:00:00Z", "2026-11-24T10:00:05Z", labels={"app": "x"}),
        _pod("chat-elsewhere", "2026-11-24T10:00:00Z", "2026-11-24T10:00:05Z", namespace="prod"),
        _pod("chat-bad-clock", "2026-11-24T10:00:00Z", "2026-11-24T09:00:00Z"),
    ]
    assert pod_startups(pods, "team", SELECTOR) == [("chat-a", 100.0), ("chat-b", 210.0)]


def test_startup_status_keeps_each_pods_first_figure_and_the_most_recent() -> None:
    first = startup_status(None, [("p0", 90.0), ("p1", 200.0)])
    assert first is not None and first.p90_seconds == pytest.approx(float(np.percentile([90, 200], 90)))
    # Read back as the API server returns it (a restarted operator starts from this)
    first = LLMDeploymentStatus.model_validate(
        LLMDeploymentStatus(startup=first).model_dump(by_alias=True)).startup
    # p0's Ready flipped later (a failed probe): its later transition time is not a start-up
    again = startup_status(first, [("p0", 5000.0), ("p2", 150.0)])
    assert again is not None and [(p.pod, p.seconds) for p in again.recent] == [("p0", 90.0), ("p1", 200.0),
                                                                                ("p2", 150.0)]
    many = startup_status(again, [(f"n{i}", 60.0) for i in range(STARTUP_SAMPLES_KEPT)])
    assert many is not None and len(many.recent) == STARTUP_SAMPLES_KEPT
    assert many.p90_seconds == pytest.approx(60.0)  # the old, slower ones have aged out
    assert startup_status(None, []) is None


def test_startup_percentile_defaults_until_measured() -> None:
    assert startup_percentile_s([], 120.0) == 120.0
    assert startup_percentile_s([100.0] * 9 + [300.0], 120.0) == pytest.approx(120.0)  # p90 of ten: interpolated


def test_the_simulator_draws_startups_the_policy_is_not_told() -> None:
    deployment = build_simulated_deployment(build_plan_inputs(load_resource(EXAMPLE).spec))
    trace = generate_synthetic_trace("synthetic:poisson:rate=1:duration=600:input=256:output=64")

    class Growing(StaticPolicy):
        """One more replica every decision: many start-ups to measure."""

        seen: tuple[float, ...] = ()

        def desired_replicas(self, stats: Any, fleet: Any) -> int:
            Growing.seen = fleet.startups_s
            return int(fleet.current_replicas) + 1

    config = FleetConfig(startup_range_s=(60.0, 300.0), seed=4, tail_s=0.0)
    simulate(deployment, trace, Growing(1), config)
    drawn = np.array(Growing.seen)
    assert len(drawn) > 10 and drawn.min() >= 60.0 and drawn.max() <= 300.0
    assert drawn.std() > 30  # drawn, not fixed
    simulate(deployment, trace, Growing(1), config)
    assert np.array_equal(np.array(Growing.seen), drawn)  # seeded

"""A multi-node deployment autoscaled end to end (tracker issue 16): Llama-3.1-405B in bf16 on H100, one
replica = a LeaderWorkerSet group of two 8-GPU pods, run by the bed's LWS controller on kwok's H100 nodes
(room for two groups). Only each group's leader gets a simulator (podsim: workers run headless, no
/metrics); the simulator uses the published 405B-on-H100 TP8 latency profile. The conversation trace,
replayed at ~2.5 req/s against a resource planned for 0.5, needs a second group; once the load stops, the
operator goes back to one group after its 30 s scale-down window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bedkit import wait_until
from e2ekit import TIME_SCALE, Stack, llmdeployment
from loadgen import LoadGenerator, rate_scale_for, replay_schedule
from operator_harness import apply, get, load_document, wait_nodes_free

# Alone on the bed, after the two-lane phase (tests/testbed/run-bed-tests.sh):
# two groups take every H100 node (wait_nodes_free).
pytestmark = pytest.mark.bed_exclusive

EXAMPLE_405B = Path(__file__).resolve().parents[2] / "examples/llama-3.1-405b-h100.yaml"
MODEL = "meta-llama/Llama-3.1-405B-Instruct"
LOAD_S = 120.0
DRAIN_S = 180.0  # the client's deadline for the requests in flight at the stop (42-55 s on the bed)
SCALE_DOWN_S = 300.0  # from the stop to one group: the drain, the rate window, the 30 s window (132 s on the bed)


def explained(stack: Stack, name: str, condition: Callable[[], bool], timeout: float, what: str) -> None:
    """wait_until, with the operator's last scale decision and the groups in the failure."""
    try:
        wait_until(condition, timeout, what)
    except AssertionError as exc:
        status = llmdeployment(stack.kube, stack.namespace, name).get("status") or {}
        raise AssertionError(f"{exc}; (spec, ready) groups {groups(stack, name)}, desired "
                             f"{status.get('desiredReplicas')}, the last decision: {status.get('lastScaleDecision')}"
                             ) from exc


def groups(stack: Stack, name: str) -> tuple[int, int]:
    """(spec.replicas, status.readyReplicas) of the LeaderWorkerSet."""
    lws: dict[str, Any] = get(stack.kube, "leaderworkerset", stack.namespace, f"{name}-lws") or {}
    return int((lws.get("spec") or {}).get("replicas") or 0), int((lws.get("status") or {}).get("readyReplicas") or 0)


@pytest.mark.timeout(720)  # ~3 min on the bed; its deadlines add up to 11
def test_a_multi_node_deployment_scales_whole_groups_under_replayed_load(stack: Stack) -> None:
    name = "llama-405b"
    wait_nodes_free(stack.kube, "NVIDIA-H100-80GB-HBM3")  # two groups take all four H100 nodes
    apply(stack.kube, stack.namespace, load_document(EXAMPLE_405B, name=name, changes={
        "workload.requestsPerSecond": 0.5, "workload.inputTokens": 1155, "workload.outputTokens": 211,
        "scaling.mode": "Auto", "scaling.minReplicas": 1, "scaling.maxReplicas": 2,
        "scaling.scaleDownStabilizationSeconds": 30, "scaling.statedLoadFloorSeconds": 0}))
    wait_until(lambda: groups(stack, name) == (1, 1), 120, "one Ready group")
    for endpoint in stack.sims.wait_for(name, 1, timeout=90, namespace=stack.namespace):
        stack.prometheus.wait_for_target_up(endpoint, timeout=30)
    assert len(stack.sims.simulators(name)) == 1  # the leader's; the worker serves nothing

    # Outputs are capped at 400 tokens so every request sent before the stop finishes inside the drain: at
    # the simulator's loaded inter-token latency (80 ms x its load factor 2) the trace's longest (667)
    # takes ~110 s, and one cut by the client's drain deadline would count as failed.
    schedule = replay_schedule(stack.trace, time_scale=TIME_SCALE,
                               rate_scale=rate_scale_for(stack.trace, TIME_SCALE, 2.5, duration_s=LOAD_S),
                               duration_s=LOAD_S, max_context_tokens=8192, max_output_tokens=400, seed=3)
    load = LoadGenerator(schedule, lambda: stack.sims.endpoints(name, stack.namespace), MODEL,
                         max_duration_s=LOAD_S, max_in_flight=400, drain_timeout_s=DRAIN_S, seed=3).start()
    try:
        explained(stack, name, lambda: groups(stack, name) == (2, 2), LOAD_S, "a second Ready group under load")
        up_at = load.elapsed()
        wait_until(lambda: len(stack.sims.endpoints(name, stack.namespace)) == 2, 60, "the second leader serving")
    finally:
        load.stop()
        stopped = time.monotonic()  # nothing is sent after this: the scale-down window can start no earlier
        assert load.wait(DRAIN_S + 30)
    drained = time.monotonic()
    report = load.report()
    assert report.results and sum(r.ok for r in report.results) >= 0.95 * len(report.results), report.summary()
    status = llmdeployment(stack.kube, stack.namespace, name)["status"]
    assert status["plan"]["pipelineParallel"] == 2 and status["desiredReplicas"] >= 1

    # The requests still queued keep the leaders busy through the drain; the rate window and the 30 s
    # scale-down window follow it.
    explained(stack, name, lambda: groups(stack, name)[0] == 1, SCALE_DOWN_S - (drained - stopped),
              "back to one group once the load stopped")
    down_after_s = time.monotonic() - stopped
    print(f"second group Ready {up_at:.0f} s into the load; drained {drained - stopped:.0f} s after the stop; "
          f"one group {down_after_s:.0f} s after the stop")
    assert down_after_s >= 25, "scaled down before the 30 s window"  # the window, less a resync
    assert up_at < LOAD_S

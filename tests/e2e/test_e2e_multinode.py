"""A multi-node deployment autoscaled end to end (tracker issue 16): Llama-3.1-405B in bf16 on H100, one
replica = a LeaderWorkerSet group of two 8-GPU pods, run by the bed's LWS controller on kwok's H100 nodes
(room for two groups). Only each group's leader gets a simulator (podsim: workers run headless, no
/metrics); the simulator uses the published 405B-on-H100 TP8 latency profile. The conversation trace,
replayed at ~2.5 req/s against a resource planned for 0.5, needs a second group; once the load stops, the
operator goes back to one group after its 30 s scale-down window.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bedkit import wait_until
from e2ekit import TIME_SCALE, Stack, llmdeployment
from loadgen import LoadGenerator, rate_scale_for, replay_schedule
from operator_harness import apply, get, load_document, wait_nodes_free

EXAMPLE_405B = Path(__file__).resolve().parents[2] / "examples/llama-3.1-405b-h100.yaml"
MODEL = "meta-llama/Llama-3.1-405B-Instruct"
LOAD_S = 120.0


def groups(stack: Stack, name: str) -> tuple[int, int]:
    """(spec.replicas, status.readyReplicas) of the LeaderWorkerSet."""
    lws: dict[str, Any] = get(stack.kube, "leaderworkerset", stack.namespace, f"{name}-lws") or {}
    return int((lws.get("spec") or {}).get("replicas") or 0), int((lws.get("status") or {}).get("readyReplicas") or 0)


def test_a_multi_node_deployment_scales_whole_groups_under_replayed_load(stack: Stack) -> None:
    name = "llama-405b"
    wait_nodes_free(stack.kube, "NVIDIA-H100-80GB-HBM3")  # two groups take all four H100 nodes
    apply(stack.kube, stack.namespace, load_document(EXAMPLE_405B, name=name, **{
        "workload.requestsPerSecond": 0.5, "workload.inputTokens": 1155, "workload.outputTokens": 211,
        "scaling.mode": "Auto", "scaling.minReplicas": 1, "scaling.maxReplicas": 2,
        "scaling.scaleDownStabilizationSeconds": 30}))
    wait_until(lambda: groups(stack, name) == (1, 1), 120, "one Ready group")
    for endpoint in stack.sims.wait_for(name, 1, timeout=90, namespace=stack.namespace):
        stack.prometheus.wait_for_target_up(endpoint, timeout=30)
    assert len(stack.sims.simulators(name)) == 1  # the leader's; the worker serves nothing

    schedule = replay_schedule(stack.trace, time_scale=TIME_SCALE,
                               rate_scale=rate_scale_for(stack.trace, TIME_SCALE, 2.5, duration_s=LOAD_S),
                               duration_s=LOAD_S, max_context_tokens=8192, seed=3)
    load = LoadGenerator(schedule, lambda: stack.sims.endpoints(name, stack.namespace), MODEL,
                         max_duration_s=LOAD_S, max_in_flight=400, drain_timeout_s=60, seed=3).start()
    try:
        wait_until(lambda: groups(stack, name) == (2, 2), LOAD_S, "a second Ready group under load")
        up_at = load.elapsed()
        wait_until(lambda: len(stack.sims.endpoints(name, stack.namespace)) == 2, 60, "the second leader serving")
    finally:
        load.stop()
        assert load.wait(120)
    report = load.report()
    assert report.results and sum(r.ok for r in report.results) >= 0.95 * len(report.results), report.summary()
    status = llmdeployment(stack.kube, stack.namespace, name)["status"]
    assert status["plan"]["pipelineParallel"] == 2 and status["desiredReplicas"] >= 1

    stopped = time.monotonic()

    def one_group() -> bool:
        return groups(stack, name)[0] == 1

    try:
        wait_until(one_group, 150, "back to one group once the load stopped")
    except AssertionError as exc:
        decision = llmdeployment(stack.kube, stack.namespace, name)["status"].get("lastScaleDecision")
        raise AssertionError(f"{exc}; the last decision: {decision}") from exc
    assert time.monotonic() - stopped >= 25, "scaled down before the 30 s window"  # the window, less a resync
    assert up_at < LOAD_S

"""Graceful scale-down on the bed (tracker issue 14): replicas go while requests stream, and none is lost.

Four replicas serve long requests (800 output tokens, 10-20 s each on the 8b-h100-balanced profile); one
replica also gets a second stream of its own, so it is clearly the busiest. The resource is then changed so
the operator wants one replica (a new plan; Recommend mode keeps the autoscaler from adding any back) while
every replica still has requests in flight. Asserted:

* before the scale-down the operator wrote each pod's requests in flight as pod-deletion-cost, so the
  ReplicaSet removed the idle-most replicas and the busiest one is the survivor;
* every request completes with all its tokens, including those still streaming on the removed replicas
  when they went (the bed's pod simulator stops a terminated pod the way a kubelet does: after its preStop
  hook, at most terminationGracePeriodSeconds; at once when there is no hook, which is when vLLM cuts
  its streams);
* the pod template's grace period covers the longest request the plan expects.
"""

from __future__ import annotations

import time

from bedkit import wait_until
from e2ekit import MODEL, SCAN_INTERVAL_S, Stack, running_pods
from loadgen import LoadGenerator, TraceRequest

from kvscale.kube.drain import DELETION_COST_ANNOTATION
from kvscale.metrics import DeploymentKey, PrometheusSource

OUTPUT_TOKENS = 800
REPLICAS = 4


def steady(rate_rps: float, duration_s: float) -> list[TraceRequest]:
    return [TraceRequest(at_s=i / rate_rps, input_tokens=200, output_tokens=OUTPUT_TOKENS)
            for i in range(int(duration_s * rate_rps))]


def test_scale_down_under_load_removes_the_idle_most_replicas_and_drops_no_request(stack: Stack) -> None:
    name = "drain"
    replicas = stack.deploy(name, **{"scaling.mode": "Recommend", "scaling.minReplicas": REPLICAS})
    assert replicas == REPLICAS
    template = stack.kube.apps.read_namespaced_deployment(name, stack.namespace).spec.template.spec
    # the fixture's SLOs (TTFT 2.5 s, TPOT 50 ms) and its 211-token mean output: the longest request the plan
    # expects is ~1,458 tokens (the geometric p99.9), 75 s at the TPOT bound
    assert template.termination_grace_period_seconds >= 75, template.termination_grace_period_seconds
    assert template.containers[0].lifecycle.pre_stop._exec.command[:2] == ["python3", "-c"]

    sims = sorted(stack.sims.simulators(name), key=lambda s: s.pod)
    busiest = sims[0]
    everyone = LoadGenerator(steady(2.0, 120), lambda: stack.sims.endpoints(name, stack.namespace), MODEL,
                             max_duration_s=120, max_in_flight=200, drain_timeout_s=120, seed=3)
    extra = LoadGenerator(steady(0.6, 120), lambda: [busiest.host_port], MODEL,
                          max_duration_s=120, max_in_flight=200, drain_timeout_s=120, seed=4)
    everyone.start()
    extra.start()
    try:
        # what the operator will read: every replica busy, the chosen one clearly the busiest
        source = PrometheusSource(stack.prometheus.url)
        key = DeploymentKey(stack.namespace, name)

        clear_since: float | None = None

        def loads_seen() -> dict[str, float] | None:
            nonlocal clear_since
            loads = source.in_flight_by_pod([key]).get(key, {})
            others = [loads.get(s.pod, 0.0) for s in sims[1:]]
            clear = len(loads) == REPLICAS and min(others) > 0.5 and loads[busiest.pod] > 1.5 * max(others)
            if not clear:
                clear_since = None
                return None
            # The operator writes the costs from its last resync's figures, not from this read: the loads
            # must have been clear for a resync and a scrape before the scale-down (seen once, at the start
            # of the streams, the figures a resync earlier could still tie, and the ReplicaSet then picks).
            if clear_since is None:
                clear_since = time.monotonic()
            return loads if time.monotonic() - clear_since >= 3 * SCAN_INTERVAL_S else None

        loads = wait_until(loads_seen, 90, "every replica busy in Prometheus, the busiest clearly so for 3 resyncs")
        scaled_at = everyone.elapsed()
        stack.kube.custom.patch_namespaced_custom_object(
            "kvscale.dev", "v1alpha1", stack.namespace, "llmdeployments", name,
            {"spec": {"scaling": {"minReplicas": 1}}})
        wait_until(lambda: stack.kube.apps.read_namespaced_deployment(name, stack.namespace).spec.replicas == 1,
                   30, "the Deployment scaled to 1")
        everyone.stop()
        extra.stop()
        survivors = stack.sims.wait_for(name, 1, timeout=150, namespace=stack.namespace)
    finally:
        everyone.stop()
        extra.stop()
        assert everyone.wait(200) and extra.wait(200)

    assert running_pods(stack.kube, stack.namespace, name) == [busiest.pod], (loads, survivors)
    cost = stack.kube.core.read_namespaced_pod(busiest.pod, stack.namespace).metadata.annotations
    assert int(cost[DELETION_COST_ANNOTATION]) > 0, cost

    results = everyone.report().results + extra.report().results
    failed = [(r.endpoint, r.error, r.tokens) for r in results if not (r.ok and r.tokens == OUTPUT_TOKENS)]
    assert results and not failed, f"{len(failed)} of {len(results)} requests failed: {failed[:5]}"
    removed = {s.host_port for s in sims[1:]}
    # the drain mattered: requests were streaming on the removed replicas when they went, and finished
    caught = [r for r in everyone.report().results
              if r.endpoint in removed and r.sent_s < scaled_at and r.done_s is not None and r.done_s > scaled_at + 2]
    assert caught, "no request was in flight on the removed replicas at the scale-down"

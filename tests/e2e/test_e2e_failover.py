"""Two operators, one active, and a failover under load (issue 15).

Two `kvscale run` processes with the chart's peering settings (`--peering`, each its own POD_ID and
priority, `--peering-lifetime 15`) watch one namespace whose KopfPeering the chart would create.
Simulated vLLM pods serve a replayed conversation trace whose rate triples after 30 s, so replicas
must rise; the scale-down window is long (600 s), so no replica may come back down in the test.

* While both run, exactly one writes: the standby's write count stays 0 (from each probe's report)
  while the active's grows.
* The active is killed with SIGKILL; the standby takes over within the peering lifetime plus two
  resync intervals (the bound asserted and measured: the time until the resource's observed metrics,
  rewritten every resync, move again).
* Across the handover no decision is lost or doubled: the replica count never steps back, and the
  new active carries on scaling with the load.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime

from bedkit import Kube, Prometheus, wait_until
from e2ekit import SCAN_INTERVAL_S, Recorder, llmdeployment, serving_pods
from helm_support import apply_peering_crds
from loadgen import Surge
from operator_harness import OperatorProcess, apply

PEERING = "kvscale"
LIFETIME_S = 15


def sampled_at(kube: Kube, namespace: str, name: str) -> str | None:
    observed = (llmdeployment(kube, namespace, name).get("status") or {}).get("observed") or {}
    found = observed.get("sampledAt")
    return None if found is None else str(found)


def test_two_replicas_one_writes_and_a_sigkill_hands_over_without_a_step_back(
        kube: Kube, prometheus: Prometheus, namespace: str) -> None:
    apply_peering_crds(kube)
    apply(kube, namespace, {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}})
    operators = [OperatorProcess(namespace, scan_interval_s=SCAN_INTERVAL_S, prometheus_url=prometheus.url,
                                 peering=PEERING, peering_lifetime_s=LIFETIME_S, pod_id=f"kvscale-{i}")
                 for i in range(2)]
    name = "failover"
    try:
        with serving_pods(kube, prometheus, namespace) as stack:
            for operator in operators:
                operator.start()
            roles = wait_until(lambda: (r := sorted(o.report()["role"] for o in operators)) == ["active", "standby"]
                               and r, 60, "one active and one standby")
            assert roles == ["active", "standby"]
            active, standby = sorted(operators, key=lambda o: o.report()["role"])
            planned = stack.deploy(name, **{"scaling.scaleDownStabilizationSeconds": 600})
            with Recorder(kube, namespace, name) as rec:
                load = stack.load(name, base_rps=1.5, duration_s=200, surge=Surge(3.0, 30.0, 200.0)).start()
                try:
                    start = {o.pod_id: o.report()["writes"] for o in operators}
                    wait_until(lambda: rec.now() >= 90, 120, "90 s of load with both operators", interval=1.0)
                    both = {o.pod_id: o.report()["writes"] - start[o.pod_id] for o in operators}
                    assert standby.report()["role"] == "standby"
                    before_kill = rec.samples[-1].replicas

                    active.kill()
                    killed_at, killed_clock = rec.now(), time.time()
                    last_seen = sampled_at(kube, namespace, name)

                    def resumed() -> bool:  # the survivor's first resync writes fresh metrics
                        seen = sampled_at(kube, namespace, name)
                        return seen is not None and seen != last_seen and datetime.fromisoformat(
                            seen.replace("Z", "+00:00")).timestamp() >= killed_clock - 1

                    wait_until(resumed, LIFETIME_S + 60, "the standby to take over", interval=0.5)
                    # the error budget's view, through the CRD's schema (a field it lacked would be pruned)
                    observed = llmdeployment(kube, namespace, name)["status"]["observed"]
                    handover_s = rec.now() - killed_at
                    wait_until(lambda: standby.report()["role"] == "active", 30, "the survivor to report active")
                    wait_until(lambda: rec.now() - killed_at >= 60, 90, "a minute under the survivor", interval=1.0)
                finally:
                    load.stop()
                    load.wait(90)
    finally:
        for operator in operators:
            operator.stop()

    timeline = [(round(s.t), s.replicas) for s in rec.samples]
    print(f"\nfailover: writes while both ran {both}; handover {handover_s:.1f} s after SIGKILL "
          f"(bound {LIFETIME_S} s lifetime + 2 resyncs); replicas {planned} -> {before_kill} at the kill -> "
          f"{rec.samples[-1].replicas}")
    assert both[standby.pod_id] == 0, f"the standby wrote while the active ran: {both}"
    assert both[active.pod_id] > 0, both
    assert handover_s <= LIFETIME_S + 2 * SCAN_INTERVAL_S + 5, f"handover took {handover_s:.1f} s"
    steps_back = [(a, b) for a, b in itertools.pairwise(timeline) if b[1] < a[1]]
    assert steps_back == [], f"replicas stepped back: {timeline}"
    assert before_kill > planned, f"the load did not scale it up before the kill: {timeline}"
    assert 0.0 <= observed.get("withinSloPct", -1.0) <= 100.0, observed

"""Prometheus misbehaving under a live operator (issue 19).

A fault injector (tests/testbed/faultprom.py) sits between the operator and the bed's real
Prometheus, which keeps scraping real simulated vLLM pods under replayed load:

* broken replies (HTTP 200 without `data`, not JSON, a result that is not a vector, a sample without
  a value, HTTP 500): MetricsUnavailable names the fault, the replica count holds although a light load
  would have it scale down, the resync loop keeps completing passes, the liveness probe stays green,
  and everything recovers when the real Prometheus answers again (and then it does scale down);
* a Prometheus so slow that the resync loop completes no pass: the liveness probe fails, and
  passes again once Prometheus is fast.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from bedkit import Kube, Prometheus, free_port, wait_until
from e2ekit import RESOURCE, SCAN_INTERVAL_S, Recorder, apply, serving_stack
from faultprom import BROKEN_REPLIES, FaultyPrometheus
from operator_harness import condition, get, install_crd, load_document, running_operator

# What MetricsUnavailable must say about each broken reply (the message also names the Prometheus).
TOLD = {
    "no-data": ("malformed reply", "KeyError: 'data'"),
    "not-json": ("malformed reply", "JSONDecodeError"),
    "result-not-a-list": ("expected a vector of samples, got oops",),
    "sample-without-value": ("expected a vector of samples, got [{'metric': {}}]",),
    "server-error": ("failed", "500"),
}


def probe(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_malformed_prometheus_replies_hold_replicas_and_the_loop_recovers(
        kube: Kube, prometheus: Prometheus, namespace: str) -> None:
    name = "malformed"
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    with FaultyPrometheus(prometheus.url) as faulty, serving_stack(
            kube, prometheus, namespace, operator_prometheus_url=faulty.url, liveness_endpoint=liveness) as stack:
        state = stack.operator.state
        # Planned for 12 req/s, served 1 req/s: with metrics the loop scales down after its 30 s window.
        planned = stack.deploy(name, **{"workload.requestsPerSecond": 12})
        assert planned >= 2
        with Recorder(kube, namespace, name) as rec:
            load = stack.load(name, base_rps=1.0, duration_s=400).start()
            try:
                wait_until(lambda: rec.samples and rec.samples[-1].metrics_unavailable == "False", 90,
                           "fresh metrics through the proxy")
                faults_from = rec.now()
                seen: dict[str, str] = {}
                for mode in BROKEN_REPLIES:
                    faulty.mode = mode
                    passes = state.resyncs

                    def told(mode: str = mode) -> str:
                        found = condition(get(kube, "llmd", namespace, name), "MetricsUnavailable")
                        message = str((found or {}).get("message", ""))
                        assert found and found["status"] == "True" and faulty.url in message, found
                        assert all(part in message for part in TOLD[mode]), found
                        return message

                    seen[mode] = wait_until(told, 10 * SCAN_INTERVAL_S + 30, f"MetricsUnavailable for {mode}")
                    def resynced(passes: int = passes) -> bool:
                        return bool(state.resyncs >= passes + 3)

                    wait_until(resynced, 60, f"three more resync passes under {mode}")
                    status, body = probe(liveness)
                    assert status == 200, f"liveness under {mode}: {status} {body}"
                # Held for longer than the scale-down window, then the real Prometheus is back.
                wait_until(lambda: rec.now() - faults_from >= 30 + 2 * SCAN_INTERVAL_S, 60, "the faults to last")
                faults_until = rec.now()
                faulty.mode = "proxy"
                wait_until(lambda: rec.samples[-1].metrics_unavailable == "False" and rec.now() > faults_until, 90,
                           "MetricsUnavailable=False once Prometheus answers again")
                down = wait_until(lambda: rec.first(lambda s: s.replicas < planned, after=faults_until), 150,
                                  "the scale-down the light load calls for, once metrics are back")
            finally:
                load.stop()
                load.wait(90)

    during = {s.replicas for s in rec.between(faults_from, faults_until)}
    assert during == {planned}, f"replicas moved without usable metrics: {during}"
    assert down.replicas < planned
    assert all(faulty.requests[mode] > 0 for mode in BROKEN_REPLIES), faulty.requests
    assert state.failures == 0  # no pass failed outright: a broken Prometheus is a condition, not a crash


def test_a_stalled_resync_loop_fails_the_liveness_probe_until_it_recovers(
        kube: Kube, prometheus: Prometheus, namespace: str) -> None:
    install_crd(kube)
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    stall_limit_s = 12.0
    with FaultyPrometheus(prometheus.url, delay_s=4.0) as faulty, running_operator(
            kube, scan_interval_s=SCAN_INTERVAL_S, namespaces=(namespace,), prometheus_url=faulty.url,
            liveness_endpoint=liveness, liveness_stall_s=stall_limit_s) as running:
        apply(kube, namespace, load_document(RESOURCE))
        wait_until(lambda: running.state.resyncs >= 2, 60, "two resync passes")
        status, body = probe(liveness)
        assert status == 200, body
        assert json.loads(body)["reconciles"]["resyncs"] >= 2

        # Every query now takes 4 s: one pass (a query per signal) takes about a minute.
        faulty.mode = "slow"
        passes = running.state.resyncs
        wait_until(lambda: probe(liveness)[0] == 500, stall_limit_s + 40, "the liveness probe to fail")
        assert running.state.resyncs <= passes + 1  # at most the pass under way when it slowed down

        faulty.mode = "proxy"
        wait_until(lambda: probe(liveness)[0] == 200, 60, "the liveness probe to pass again")


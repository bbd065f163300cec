"""Faults a production operator meets, injected into the real bed (issue 19).

* kube-apiserver SIGKILLed while five new resources are being reconciled, restarted 3 s later: one
  Deployment (one ReplicaSet) and one Service per resource, all Planned with a correct status; then
  nothing is written;
* etcd SIGKILLed just after a spec change, restarted 5 s later: the new plan is rolled out and
  reported, the operator keeps running; then nothing is written;
* a second writer annotating the resource (409s under kvscale's status write) and scaling its
  Deployment ten times a second while the spec changes: kvscale's values win, the conflicts are told
  (a FieldConflict Event names the writer), the status matches the last spec; then nothing is written;
* `kvscale run` killed with SIGKILL right after it started rolling out a new plan, then started
  again: the rollout completes, the status catches up, and the new operator writes nothing once
  converged.

Every process is restarted with its exact command line (tests/testbed/bedctl.py), so the bed is
whole again for the tests after these.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from bedctl import BED_APISERVER, BED_ETCD
from bedkit import Kube, wait_until
from operator_harness import (
    EXAMPLES,
    OperatorProcess,
    RunningOperator,
    apply,
    condition,
    container_args,
    events,
    flag,
    get,
    install_crd,
    load_document,
    wait_quiet,
)

# Alone on the bed, after the two-lane phase (tests/testbed/run-bed-tests.sh):
# it kills and restarts the bed's kube-apiserver and etcd, under every test.
pytestmark = pytest.mark.bed_exclusive

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-3.1-70b-h100.yaml"
NAME = "llama-70b"
SCAN_INTERVAL_S = 2.0


def converged(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The resource when its status describes its current spec and live Deployment, else None."""
    obj = get(kube, "llmd", namespace, name)
    deployment = get(kube, "deployment", namespace, name)
    if obj is None or deployment is None or get(kube, "service", namespace, name) is None:
        return None
    status = obj.get("status") or {}
    planned = condition(obj, "Planned")
    failed = condition(obj, "WriteFailed")
    ok = (status.get("observedGeneration") == obj["metadata"]["generation"] and planned is not None
          and planned["status"] == "True" and failed is not None and failed["status"] == "False"
          and status.get("desiredReplicas") == deployment["spec"]["replicas"]
          and status.get("replicas") == (deployment.get("status") or {}).get("replicas", 0))
    return obj if ok else None


def test_apiserver_restarted_mid_reconcile(kube: Kube, namespace: str,
                                           operator_in_namespace: RunningOperator) -> None:
    operator = operator_in_namespace
    documents = [load_document(path) for path in EXAMPLES]
    names = [d["metadata"]["name"] for d in documents]
    result = kube.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(documents))
    assert result.returncode == 0, result.stderr
    wait_until(lambda: operator.state.reconciles >= 1, 30, "the operator to start reconciling", interval=0.05)
    with BED_APISERVER.outage(signal.SIGKILL):
        time.sleep(3)  # the outage itself: what is injected, not a synchronisation
    def rolled_out(name: str) -> bool:
        deployment = get(kube, "deployment", namespace, name)
        return deployment is not None and (deployment.get("status") or {}).get("observedGeneration") == deployment[
            "metadata"]["generation"] and converged(kube, namespace, name) is not None

    for name in names:  # converged, and the deployment controller has seen the final Deployment
        wait_until(partial(rolled_out, name), 180, f"{name} to converge after the restart")

    for name in names:
        owner = get(kube, "llmd", namespace, name)
        assert owner is not None
        uid = owner["metadata"]["uid"]
        replica_sets = [rs for rs in json.loads(kube.kubectl("get", "replicasets", "-n", namespace, "-o", "json",
                                                             check=True).stdout)["items"]
                        if rs["metadata"]["ownerReferences"][0]["name"] == name]
        assert len(replica_sets) == 1, f"{name}: {len(replica_sets)} ReplicaSets (a duplicate rollout)"
        for kind in ("deployment", "service"):
            obj = get(kube, kind, namespace, name)
            assert obj is not None
            refs = obj["metadata"]["ownerReferences"]
            assert [r["uid"] for r in refs] == [uid], (kind, refs)
        reasons = [e["reason"] for e in events(kube, namespace, name)]
        assert reasons.count("DeploymentCreated") <= 1 and reasons.count("ServiceCreated") <= 1, reasons
    deployments = json.loads(kube.kubectl("get", "deployments", "-n", namespace, "-o", "json", check=True).stdout)
    assert sorted(d["metadata"]["name"] for d in deployments["items"]) == sorted(names)
    wait_quiet(kube, namespace, names, lambda: operator.state.resyncs)
    assert operator.thread.is_alive()


def test_etcd_stopped_for_seconds_during_a_spec_change(kube: Kube, namespace: str,
                                                       operator_in_namespace: RunningOperator) -> None:
    operator = operator_in_namespace
    apply(kube, namespace, load_document(EXAMPLE))
    before = wait_until(lambda: converged(kube, namespace, NAME), 120, "the resource to converge")
    old_args = container_args(get(kube, "deployment", namespace, NAME))  # type: ignore[arg-type]
    apply(kube, namespace, load_document(EXAMPLE, changes={"slo.tpotMs": 20}))
    with BED_ETCD.outage(signal.SIGKILL):
        time.sleep(5)  # the outage: etcd gone for five seconds
    after = wait_until(lambda: (o := converged(kube, namespace, NAME))
                       and o["metadata"]["generation"] > before["metadata"]["generation"] and o,
                       180, "the new plan to converge after etcd is back")
    args = container_args(get(kube, "deployment", namespace, NAME))  # type: ignore[arg-type]
    assert args != old_args
    assert flag(args, "--max-num-seqs") == str(after["status"]["plan"]["maxNumSeqs"])
    wait_quiet(kube, namespace, [NAME], lambda: operator.state.resyncs)
    assert operator.thread.is_alive()


def test_a_second_writer_gets_409s_and_kvscale_values_win(kube: Kube, namespace: str,
                                                          operator_in_namespace: RunningOperator) -> None:
    operator = operator_in_namespace
    from kubernetes import client

    apply(kube, namespace, load_document(EXAMPLE))
    wait_until(lambda: converged(kube, namespace, NAME), 120, "the resource to converge")
    custom, apps = client.CustomObjectsApi(kube.api_client), client.AppsV1Api(kube.api_client)
    stop = threading.Event()
    writes = {"annotate": 0, "scale": 0}

    def second_writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            custom.patch_namespaced_custom_object(  # bumps the resourceVersion under kvscale's status write
                "kvscale.dev", "v1alpha1", namespace, "llmdeployments", NAME,
                {"metadata": {"annotations": {"example.com/second-writer": str(n)}}}, field_manager="second-writer")
            writes["annotate"] += 1
            apps.patch_namespaced_deployment_scale(NAME, namespace, {"spec": {"replicas": 1 + n % 4}},
                                                   field_manager="second-writer")
            writes["scale"] += 1
            stop.wait(0.1)

    thread = threading.Thread(target=second_writer, daemon=True)
    thread.start()
    try:
        time.sleep(2)  # the second writer racing kvscale's own writes: the fault itself
        apply(kube, namespace, load_document(EXAMPLE, changes={"slo.tpotMs": 20}))  # a spec change in the middle
        time.sleep(8)
    finally:
        stop.set()
        thread.join(10)
    assert writes["annotate"] >= 20 and writes["scale"] >= 20, writes

    final = wait_until(lambda: (o := converged(kube, namespace, NAME)) and o["metadata"]["generation"] >= 2 and o,
                       120, "kvscale's values back after the second writer stopped")
    deployment = get(kube, "deployment", namespace, NAME)
    assert deployment is not None and deployment["spec"]["replicas"] == final["status"]["desiredReplicas"]
    assert flag(container_args(deployment), "--max-num-seqs") == str(final["status"]["plan"]["maxNumSeqs"])
    conflicts = [e for e in events(kube, namespace, NAME) if e["reason"] == "FieldConflict"]
    assert conflicts and "second-writer" in conflicts[0]["message"], conflicts
    assert operator.state.conflicts > 0
    assert operator.state.failures == 0
    wait_quiet(kube, namespace, [NAME], lambda: operator.state.resyncs)


def test_operator_killed_mid_rollout_converges_and_then_writes_nothing(kube: Kube, namespace: str) -> None:
    install_crd(kube)
    first, second = OperatorProcess(namespace), OperatorProcess(namespace)
    try:
        first.start()
        apply(kube, namespace, load_document(EXAMPLE))
        wait_until(lambda: converged(kube, namespace, NAME), 120, "the resource to converge")
        before = get(kube, "deployment", namespace, NAME)
        assert before is not None
        apply(kube, namespace, load_document(EXAMPLE, changes={"slo.tpotMs": 20}))
        # The moment kvscale has started the rollout (the Deployment's template changed), kill it.
        wait_until(lambda: get(kube, "deployment", namespace, NAME)["metadata"]["generation"]  # type: ignore[index]
                   > before["metadata"]["generation"], 60, "the rollout to start", interval=0.05)
        first.kill()

        second.start()
        after = wait_until(lambda: (o := converged(kube, namespace, NAME)) and o["metadata"]["generation"] >= 2 and o,
                           120, "convergence under the restarted operator")
        deployment = get(kube, "deployment", namespace, NAME)
        assert deployment is not None
        assert flag(container_args(deployment), "--max-num-seqs") == str(after["status"]["plan"]["maxNumSeqs"])
        wait_until(lambda: (d := get(kube, "deployment", namespace, NAME)) and d["status"].get("updatedReplicas")
                   == d["spec"]["replicas"] == d["status"].get("readyReplicas"), 120, "the rollout to complete")
        wait_quiet(kube, namespace, [NAME], lambda: second.report()["resyncs"])
        writes = second.report()["writes"]
        wait_quiet(kube, namespace, [NAME], lambda: second.report()["resyncs"])
        assert second.report()["writes"] == writes, "the restarted operator kept writing once converged"
    finally:
        first.stop()
        second.stop()

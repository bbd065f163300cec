"""The operator's failure paths on the real bed (issue 19): state changes leave nothing stale, and a
write the API server refuses leaves the rest of the pass done and visible.

Each test runs its own operator watching only its namespace, so the operator's counters (passes,
refused writes) and its log are the test's alone.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from bedkit import Kube, wait_until
from operator_harness import (
    RunningOperator,
    apply,
    apply_quota,
    events,
    get,
    load_document,
    required_condition,
    wait_condition,
    wait_quiet,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-3.1-70b-h100.yaml"
NAME = "llama-70b"
SCAN_INTERVAL_S = 2.0


STALE_WHEN_INFEASIBLE = ("predicted", "desiredReplicas", "ttftAtSloPercentileMs", "tpotAtSloPercentileMs", "ttftP95Ms",
                         "tpotP95Ms", "observed", "sloMet")


def test_feasible_infeasible_feasible_leaves_no_stale_field(kube: Kube, namespace: str,
                                                            operator_in_namespace: RunningOperator) -> None:
    def settled() -> dict[str, str]:
        return wait_quiet(kube, namespace, [NAME], lambda: operator_in_namespace.state.resyncs)

    apply(kube, namespace, load_document(EXAMPLE))
    planned = wait_condition(kube, namespace, NAME, "Planned", "True")
    assert {"predicted", "desiredReplicas", "ttftAtSloPercentileMs", "ttftP95Ms"} <= set(planned["status"])
    # The planned Deployment's pods exist (status.replicas counts them) before the spec turns infeasible.
    wait_until(lambda: (d := get(kube, "deployment", namespace, NAME)) is not None
               and (d.get("status") or {}).get("replicas") == d["spec"]["replicas"], 60, "the planned pods")

    apply(kube, namespace, load_document(EXAMPLE, changes={"slo.tpotMs": 1}))
    infeasible = wait_condition(kube, namespace, NAME, "Infeasible", "True")
    status = infeasible["status"]
    assert status["observedGeneration"] == infeasible["metadata"]["generation"]
    assert [k for k in STALE_WHEN_INFEASIBLE if k in status] == [], status
    assert status["plan"]["feasible"] is False and "gpuType" not in status["plan"], status["plan"]
    assert {c["type"] for c in status["conditions"]} == {"Planned", "Ready", "Infeasible", "InvalidSpec"}
    assert required_condition(infeasible, "Ready")["reason"] == "NoFeasiblePlan"
    deployment = get(kube, "deployment", namespace, NAME)
    assert deployment is not None  # the last good plan keeps serving
    assert status["replicas"] == deployment["spec"]["replicas"]
    settled()
    kept = get(kube, "deployment", namespace, NAME)
    assert kept is not None  # untouched by kvscale while infeasible (its controller updates only status)
    assert kept["metadata"]["generation"] == deployment["metadata"]["generation"]
    assert kept["spec"] == deployment["spec"]

    apply(kube, namespace, load_document(EXAMPLE))
    again = wait_until(lambda: (o := get(kube, "llmd", namespace, NAME))
                       and required_condition(o, "Planned")["status"] == "True"
                       and o["status"]["observedGeneration"] == o["metadata"]["generation"] and o,
                       60, "Planned again for the new generation")
    assert required_condition(again, "Infeasible")["status"] == "False"
    assert {"predicted", "desiredReplicas", "ttftAtSloPercentileMs", "ttftP95Ms"} <= set(again["status"])
    assert again["status"]["plan"]["gpuType"] == "H100-SXM"
    settled()
    reasons = [e["reason"] for e in events(kube, namespace, NAME)]
    assert reasons.count("Infeasible") == 1, reasons


def test_a_refused_service_write_leaves_the_rest_done_backs_off_and_recovers(
        kube: Kube, namespace: str, operator_in_namespace: RunningOperator, caplog: pytest.LogCaptureFixture) -> None:
    """Injected with a real ResourceQuota that allows no Service in the namespace (the API server
    answers 403 "exceeded quota"): the fault of a full Service IP range, a quota or an admission
    webhook alike."""
    operator = operator_in_namespace
    caplog.set_level(logging.WARNING, logger="kvscale.operator")
    apply_quota(kube, namespace, "no-services", {"services": "0"})

    # Pinned to TP4: the example's own plan (one TP8 replica) needs a whole free 8-GPU node, which the
    # other lanes' pods can hold for longer than the rollout wait below (one run of 2026-11-29).
    apply(kube, namespace, load_document(EXAMPLE, changes={"serving.tensorParallel": 4}))
    refused = wait_condition(kube, namespace, NAME, "WriteFailed", "True")
    message = required_condition(refused, "WriteFailed")["message"]
    assert required_condition(refused, "WriteFailed")["reason"] == "ServiceWriteFailed"
    assert "apply Service" not in message and "create Service" in message and "exceeded quota" in message, message
    assert "ResourceQuota" in message, message  # what to fix
    # The rest of the pass is done and visible: the plan, the predictions, the Deployment.
    assert required_condition(refused, "Planned")["status"] == "True"
    assert refused["status"]["plan"]["gpuType"] == "H100-SXM" and "predicted" in refused["status"]
    assert wait_until(lambda: get(kube, "deployment", namespace, NAME), 30, "the Deployment")
    assert get(kube, "service", namespace, NAME) is None
    told = [e for e in events(kube, namespace, NAME) if e["reason"] == "WriteFailed"]
    assert len(told) == 1 and "ResourceQuota" in told[0]["message"], told

    # The rollout's own progress (its pods Ready, their start-up measured) rewrites the status rightly: the
    # window below starts from a status that has seen it (a busy bed makes the pods Ready seconds late).
    def rolled_out() -> bool:
        llmd, deployment = get(kube, "llmd", namespace, NAME), get(kube, "deployment", namespace, NAME)
        wanted = ((deployment or {}).get("spec") or {}).get("replicas") or 0
        return wanted >= 1 and ((llmd or {}).get("status") or {}).get("readyReplicas") == wanted

    wait_until(rolled_out, 40, "the status to count every replica Ready")
    # Back-off: over ~30 s of passes the Service is tried a handful of times, not once per pass; the
    # status is not rewritten, and the log says it once.
    passes, tries = operator.state.resyncs, operator.state.refused_writes
    version = get(kube, "llmd", namespace, NAME)["metadata"]["resourceVersion"]  # type: ignore[index]
    started = time.monotonic()
    wait_until(lambda: time.monotonic() - started >= 30, 60, "30 s of resync passes", interval=1.0)
    passes, tries = operator.state.resyncs - passes, operator.state.refused_writes - tries
    assert passes >= 8, passes
    assert 1 <= tries <= 4, f"{tries} refused tries in {passes} passes: no back-off"
    assert get(kube, "llmd", namespace, NAME)["metadata"]["resourceVersion"] == version  # type: ignore[index]
    logged = [r.getMessage() for r in caplog.records if f"{namespace}/{NAME}" in r.getMessage()]
    assert len(logged) == 1 and "exceeded quota" in logged[0], logged

    kube.kubectl("delete", "resourcequota", "no-services", "-n", namespace, check=True)
    recovered = wait_condition(kube, namespace, NAME, "WriteFailed", "False", timeout=120)
    assert required_condition(recovered, "WriteFailed")["reason"] == "WritesSucceeded"
    assert get(kube, "service", namespace, NAME) is not None
    assert "WritesRecovered" in {e["reason"] for e in events(kube, namespace, NAME)}
    wait_quiet(kube, namespace, [NAME], lambda: operator.state.resyncs)

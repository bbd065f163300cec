"""Multi-node replicas on the bed: the operator's LeaderWorkerSet, run by the real LWS controller (v0.8.0,
its webhooks on loopback) on kwok's H100 nodes (4 nodes of 8 GPUs: room for two 2-node groups)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from bedkit import Kube, wait_until
from operator_harness import (
    MULTI_NODE_EXAMPLES,
    RunningOperator,
    apply,
    condition,
    events,
    flag,
    get,
    install_crd,
    load_document,
    required_condition,
    running_operator,
    wait_condition,
    wait_nodes_free,
)

from kvscale.api.spec import load_resource
from kvscale.planner import build_plan_inputs, plan_deployment

# Alone on the bed, after the two-lane phase (tests/testbed/run-bed-tests.sh):
# two groups take every H100 node (wait_nodes_free).
pytestmark = pytest.mark.bed_exclusive

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_405B = ROOT / "examples/llama-3.1-405b-h100.yaml"
LEADER = "leaderworkerset.sigs.k8s.io/worker-index=0"
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def operator(kube: Kube) -> Iterator[RunningOperator]:
    install_crd(kube)
    with running_operator(kube) as running:
        yield running


def leader_args(lws: dict[str, Any]) -> list[str]:
    args: list[str] = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
    return args


def pods(kube: Kube, namespace: str, selector: str = "app.kubernetes.io/managed-by=kvscale") -> list[dict[str, Any]]:
    found = kube.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json", check=True)
    items: list[dict[str, Any]] = json.loads(found.stdout)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def running_pods(kube: Kube, namespace: str, count: int) -> list[dict[str, Any]] | None:
    found = pods(kube, namespace)
    running = [p for p in found if (p.get("status") or {}).get("phase") == "Running"]
    return running if len(found) == count and len(running) == count else None


def ready_groups(kube: Kube, namespace: str, name: str, groups: int) -> dict[str, Any] | None:
    llmd = get(kube, "llmd", namespace, name)
    status = (llmd or {}).get("status") or {}
    ready = condition(llmd, "Ready")
    done = status.get("readyReplicas") == groups and ready is not None and ready["status"] == "True"
    return llmd if done else None


@pytest.mark.parametrize("example", MULTI_NODE_EXAMPLES, ids=[p.stem for p in MULTI_NODE_EXAMPLES])
def test_every_multi_node_example_yields_a_leader_worker_set(
        kube: Kube, operator: RunningOperator, namespace: str, example: Path) -> None:
    chosen = plan_deployment(build_plan_inputs(load_resource(example).spec)).chosen
    assert chosen is not None and chosen.nodes_per_replica > 1
    name = yaml.safe_load(example.read_text())["metadata"]["name"]
    apply(kube, namespace, example.read_text())

    lws = wait_until(lambda: get(kube, "leaderworkerset", namespace, f"{name}-lws"), 60, "the LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == chosen.nodes_per_replica
    args = leader_args(lws)
    worker = template["workerTemplate"]["spec"]["containers"][0]
    assert flag(args, "--tensor-parallel-size") == str(chosen.tensor_parallel)
    if chosen.data_parallel > 1:  # engines over the nodes, experts over all their GPUs
        assert flag(args, "--data-parallel-size") == str(chosen.data_parallel) and "--enable-expert-parallel" in args
        assert flag(args, "--data-parallel-address") == "$(LWS_LEADER_ADDRESS)"
        assert "--data-parallel-start-rank $((LWS_WORKER_INDEX *" in worker["command"][-2]
    else:
        assert flag(args, "--pipeline-parallel-size") == flag(args, "--nnodes") == str(chosen.pipeline_parallel)
        assert flag(args, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert "--headless" in worker["args"]
    owner = lws["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "LLMDeployment" and owner["controller"] is True
    service = wait_until(lambda: get(kube, "service", namespace, name), 60, "the Service")
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert get(kube, "deployment", namespace, name) is None
    # LWS's own headless Service (pod DNS: the leader address workers join) sits beside the client Service
    headless = wait_until(lambda: get(kube, "service", namespace, f"{name}-lws"), 60, "LWS's headless Service")
    assert headless["spec"]["clusterIP"] == "None" and service["spec"]["clusterIP"] != "None"
    llmd = wait_condition(kube, namespace, name, "Planned", "True")
    assert llmd["status"]["plan"]["pipelineParallel"] == chosen.pipeline_parallel
    assert llmd["status"]["plan"]["dataParallel"] == chosen.data_parallel
    reasons = {e["reason"] for e in events(kube, namespace, name)}
    assert "LeaderWorkerSetCreated" in reasons


def test_groups_of_two_nodes_run_scale_as_units_and_are_counted_against_nodes(
        kube: Kube, operator: RunningOperator, namespace: str) -> None:
    name = "llama-405b"
    wait_nodes_free(kube, H100)  # two groups take all four H100 nodes
    apply(kube, namespace, load_document(EXAMPLE_405B, changes={"scaling.mode": "Off", "replicas": 1}))
    wait_until(lambda: ready_groups(kube, namespace, name, 1), 120, "one Ready group")
    group = wait_until(lambda: running_pods(kube, namespace, 2), 60, "two Running pods")
    assert len({p["spec"]["nodeName"] for p in group}) == 2  # one stage per node
    assert all(p["spec"]["nodeName"].startswith("gpu-h100-") for p in group)
    leaders = pods(kube, namespace, LEADER)
    assert len(leaders) == 1
    env = {e["name"]: e.get("value") for e in leaders[0]["spec"]["containers"][0].get("env") or []}
    assert env.get("LWS_WORKER_INDEX") == "0" and env.get("LWS_GROUP_SIZE") == "2"  # set by LWS's webhook

    apply(kube, namespace, load_document(EXAMPLE_405B, changes={"scaling.mode": "Off", "replicas": 2}))
    llmd = wait_until(lambda: ready_groups(kube, namespace, name, 2), 120, "two Ready groups")
    wait_until(lambda: running_pods(kube, namespace, 4), 60, "four Running pods")
    assert required_condition(llmd, "InsufficientCapacity")["status"] == "False"

    apply(kube, namespace, load_document(EXAMPLE_405B, changes={"scaling.mode": "Off", "replicas": 3}))
    short = wait_condition(kube, namespace, name, "InsufficientCapacity", "True")
    message = required_condition(short, "InsufficientCapacity")["message"]
    assert "3 x 16 H100-SXM (48 GPUs, 2 nodes x 8 per replica)" in message and "room for 2 replica(s)" in message

    apply(kube, namespace, load_document(EXAMPLE_405B, changes={"scaling.mode": "Off", "replicas": 1}))
    wait_until(lambda: running_pods(kube, namespace, 2), 120, "back to two pods (one group)")
    lws = get(kube, "leaderworkerset", namespace, f"{name}-lws")
    assert lws is not None and lws["spec"]["replicas"] == 1


def test_drift_on_the_leader_worker_set_is_put_back(
        kube: Kube, operator: RunningOperator, namespace: str) -> None:
    name = "llama-405b"
    apply(kube, namespace, EXAMPLE_405B.read_text())
    lws = wait_until(lambda: get(kube, "leaderworkerset", namespace, f"{name}-lws"), 60, "the LeaderWorkerSet")
    planned = leader_args(lws)
    patch = [{"op": "add", "path": "/spec/leaderWorkerTemplate/leaderTemplate/spec/containers/0/args/-",
              "value": "--enforce-eager"}]
    kube.kubectl("patch", "leaderworkerset", f"{name}-lws", "-n", namespace, "--type=json", "-p", json.dumps(patch),
                 check=True)
    wait_until(lambda: (lws := get(kube, "leaderworkerset", namespace, f"{name}-lws")) is not None
               and leader_args(lws) == planned, 60, "the planned leader args back")
    wait_until(lambda: [e for e in events(kube, namespace, name) if e["reason"] in ("DriftCorrected", "FieldConflict")],
               30, "an event saying the edit was put back")


def test_a_plan_that_moves_to_one_node_replaces_the_leader_worker_set_with_a_deployment(
        kube: Kube, operator: RunningOperator, namespace: str) -> None:
    name = "llama-405b"
    apply(kube, namespace, EXAMPLE_405B.read_text())
    wait_until(lambda: get(kube, "leaderworkerset", namespace, f"{name}-lws"), 60, "the LeaderWorkerSet")
    # fp8 weights (~405 GB) fit one 8 x 80 GB node: the plan's replicas become single pods
    apply(kube, namespace, load_document(EXAMPLE_405B, changes={"model.precision": "fp8"}))
    deployment = wait_until(lambda: get(kube, "deployment", namespace, name), 60, "the Deployment")
    assert "--nnodes" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    wait_until(lambda: get(kube, "leaderworkerset", namespace, f"{name}-lws") is None, 60, "the LeaderWorkerSet gone")
    service = wait_until(lambda: (s := get(kube, "service", namespace, name)) is not None
                         and "leaderworkerset.sigs.k8s.io/worker-index" not in s["spec"]["selector"] and s,
                         60, "the Service selecting the Deployment's pods")
    assert service["spec"]["selector"] == {"kvscale.dev/llmdeployment": name}
    wait_until(lambda: running_pods(kube, namespace, deployment["spec"]["replicas"]), 120,
               "only the Deployment's pods left")
    assert "WorkloadReplaced" in {e["reason"] for e in events(kube, namespace, name)}

"""The operator on the real bed (issue 4's proof): examples, changes, bad input, capacity, restart."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from bedkit import Kube, wait_until
from operator_harness import (
    EXAMPLES,
    RunningOperator,
    apply,
    container_args,
    events,
    flag,
    get,
    install_crd,
    load_document,
    required_condition,
    running_operator,
    wait_condition,
    wait_for_event,
)

from kvscale.api.spec import load_resource
from kvscale.catalog import find_gpu
from kvscale.planner import build_plan_inputs, plan_deployment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def namespaces(kube: Kube, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """A namespace for each of this module's tests, made before its operator starts, by test id. The operator
    watches exactly these: one watching every namespace would also plan and write the other lanes' resources
    (tests/testbed/run-bed-tests.sh) and fight their operators; so loaded, it took over 60 s to answer a
    resource of its own in two cold CI runs (2026-11-29)."""
    tests = [item for item in request.session.items
             if isinstance(item, pytest.Function) and item.path == request.path and "namespace" in item.fixturenames]
    made = {item.nodeid: kube.create_namespace(item.name) for item in tests}
    yield made
    for name in made.values():
        found = kube.core.list_namespace(field_selector=f"metadata.name={name}").items
        if found and found[0].status.phase == "Active":  # a test that did not run (deselected, or the run stopped)
            kube.delete_namespace(name)


@pytest.fixture
def namespace(kube: Kube, namespaces: dict[str, str], request: pytest.FixtureRequest) -> Iterator[str]:
    """This test's namespace from `namespaces` (in place of the suite's fresh one), deleted after the test (the
    operator goes on watching it: a list or watch in a namespace that is gone is empty, not an error)."""
    name = namespaces[request.node.nodeid]
    yield name
    kube.delete_namespace(name)


@pytest.fixture(scope="module")
def operator(kube: Kube, namespaces: dict[str, str]) -> Iterator[RunningOperator]:
    install_crd(kube)
    with running_operator(kube, namespaces=tuple(namespaces.values())) as running:
        yield running


def resource(path: Path, **spec_changes: Any) -> dict[str, Any]:
    return load_document(path, **spec_changes)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_yields_the_planned_deployment_and_service(
        kube: Kube, operator: RunningOperator, namespace: str, example: Path) -> None:
    spec = load_resource(example).spec
    plan = plan_deployment(build_plan_inputs(spec))
    assert plan.chosen is not None
    name = yaml.safe_load(example.read_text())["metadata"]["name"]
    apply(kube, namespace, example.read_text())

    llmd = wait_condition(kube, namespace, name, "Planned", "True")
    deployment = wait_until(lambda: get(kube, "deployment", namespace, name), 60, "the Deployment")
    service = wait_until(lambda: get(kube, "service", namespace, name), 60, "the Service")

    args = container_args(deployment)
    assert flag(args, "--tensor-parallel-size") == str(plan.chosen.tensor_parallel)
    assert flag(args, "--max-num-seqs") == str(plan.chosen.max_num_seqs)
    assert flag(args, "--max-model-len") == str(plan.chosen.max_model_len)
    assert flag(args, "--gpu-memory-utilization").startswith("0.9")
    pod = deployment["spec"]["template"]["spec"]
    gpu = find_gpu(plan.chosen.gpu_type)
    assert pod["containers"][0]["resources"]["limits"][gpu.resource_name] == str(plan.chosen.tensor_parallel)
    assert gpu.product_label in pod["nodeSelector"].values()
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])
    assert deployment["spec"]["replicas"] == plan.chosen.replicas
    owner = deployment["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "LLMDeployment" and owner["uid"] == llmd["metadata"]["uid"]
    assert service["spec"]["ports"][0]["port"] == 8000
    assert service["metadata"]["ownerReferences"][0]["uid"] == llmd["metadata"]["uid"]
    status = llmd["status"]
    assert status["plan"]["gpuType"] == plan.chosen.gpu_type
    assert status["predicted"]["tpotMs"] <= spec.slo.tpot_ms
    assert status["observedGeneration"] == llmd["metadata"]["generation"]
    reasons = {e["reason"] for e in events(kube, namespace, name)}
    assert {"Planned", "DeploymentCreated"} <= reasons


def test_pods_run_on_the_planned_gpu_nodes_and_ready_follows(
        kube: Kube, operator: RunningOperator, namespace: str) -> None:
    apply(kube, namespace, (ROOT / "examples/llama-3.1-70b-h100.yaml").read_text())
    llmd = wait_condition(kube, namespace, "llama-70b", "Ready", "True", timeout=120)
    assert llmd["status"]["readyReplicas"] == llmd["status"]["desiredReplicas"] >= 1
    pods = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-o", "json", check=True).stdout)["items"]
    assert pods and all(p["spec"]["nodeName"].startswith("gpu-h100-") for p in pods)
    assert required_condition(llmd, "InsufficientCapacity")["status"] == "False"


def test_changing_the_slo_rolls_the_deployment_and_nothing_else(
        kube: Kube, operator: RunningOperator, namespace: str) -> None:
    path = ROOT / "examples/llama-3.1-70b-h100.yaml"
    apply(kube, namespace, path.read_text())
    wait_condition(kube, namespace, "llama-70b", "Planned", "True")
    before = wait_until(lambda: get(kube, "deployment", namespace, "llama-70b"), 60, "the Deployment")
    service_before = get(kube, "service", namespace, "llama-70b")
    assert service_before is not None

    changed = resource(path, **{"slo.tpotMs": 20})
    expected = plan_deployment(build_plan_inputs(load_resource(path).spec.model_copy(update={
        "slo": load_resource(path).spec.slo.model_copy(update={"tpot_ms": 20.0})})))
    assert expected.chosen is not None
    apply(kube, namespace, changed)

    def rolled() -> dict[str, Any] | None:
        deployment = get(kube, "deployment", namespace, "llama-70b")
        return deployment if deployment and container_args(deployment) != container_args(before) else None

    after = wait_until(rolled, 60, "new engine flags")
    assert flag(container_args(after), "--max-num-seqs") == str(expected.chosen.max_num_seqs)
    assert flag(container_args(after), "--tensor-parallel-size") == str(expected.chosen.tensor_parallel)
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    service_after = get(kube, "service", namespace, "llama-70b")
    assert service_after is not None
    assert service_after["metadata"]["resourceVersion"] == service_before["metadata"]["resourceVersion"]
    wait_for_event(kube, namespace, "llama-70b", "DeploymentUpdated")


def test_drift_is_put_back(kube: Kube, operator: RunningOperator, namespace: str) -> None:
    apply(kube, namespace, (ROOT / "examples/llama-3.1-8b-l4.yaml").read_text())
    original = wait_until(lambda: get(kube, "deployment", namespace, "llama-8b-chat"), 60, "the Deployment")
    edited = [*container_args(original)]
    edited[edited.index("--max-num-seqs") + 1] = "7"
    patch = {"spec": {"template": {"spec": {"containers": [{"name": original["spec"]["template"]["spec"][
        "containers"][0]["name"], "args": edited}]}}}}
    kube.kubectl("patch", "deployment", "llama-8b-chat", "-n", namespace, "--type", "strategic", "-p",
                 json.dumps(patch), check=True)

    def restored() -> bool:
        deployment = get(kube, "deployment", namespace, "llama-8b-chat")
        return deployment is not None and container_args(deployment) == container_args(original)

    wait_until(restored, 60, "the operator to put the flags back")
    wait_for_event(kube, namespace, "llama-8b-chat", "DriftCorrected")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"slo.ttftMs": "fast"}, "spec.slo.ttftMs"),
        ({"scaling.mode": "Sometimes"}, "spec.scaling.mode"),
        ({"model.precision": "fp4"}, "spec.model.precision"),
        ({"scaling.minReplicas": 9, "scaling.maxReplicas": 2}, "minReplicas"),
        ({"workload.requestsPerSecond": 5.5, "workload.peakRequestsPerSecond": 2}, "peakRequestsPerSecond"),
        # No scale to zero (issue 19): nothing would bring a deployment back from zero replicas.
        ({"scaling.minReplicas": 0}, "spec.scaling.minReplicas"),
        ({"scaling.minReplicas": 0}, "Scale to zero is not supported"),
    ],
)
def test_the_apiserver_rejects_bad_types_at_the_door(
        kube: Kube, operator: RunningOperator, namespace: str, change: dict[str, Any], expected: str) -> None:
    document = resource(ROOT / "examples/llama-3.1-8b-l4.yaml", **change)
    result = kube.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(document))
    assert result.returncode != 0
    assert expected in result.stderr
    assert get(kube, "llmd", namespace, "llama-8b-chat") is None


def test_semantic_errors_get_a_condition_and_event_and_others_keep_working(
        kube: Kube, operator: RunningOperator, namespace: str) -> None:
    base = ROOT / "examples/llama-3.1-8b-l4.yaml"
    unknown = resource(base, **{"model.name": "acme/NoSuchModel-7B"})
    unknown["metadata"]["name"] = "unknown-model"
    too_wide = resource(base, **{"serving.tensorParallel": 16, "gpu.perNode": 8})
    too_wide["metadata"]["name"] = "tp-too-wide"
    impossible = resource(base, **{"slo.tpotMs": 1})
    impossible["metadata"]["name"] = "impossible-slo"
    for document in (unknown, too_wide, impossible):
        apply(kube, namespace, document)

    bad_model = wait_condition(kube, namespace, "unknown-model", "InvalidSpec", "True")
    assert "not in the catalog" in required_condition(bad_model, "InvalidSpec")["message"]
    wide = wait_condition(kube, namespace, "tp-too-wide", "Infeasible", "True")
    assert "tensorParallel 16 exceeds 8 GPUs per node" in required_condition(wide, "Infeasible")["message"]
    slo = wait_condition(kube, namespace, "impossible-slo", "Infeasible", "True")
    assert "TPOT 1 ms unreachable: best is" in required_condition(slo, "Infeasible")["message"]
    for name, reason in (("unknown-model", "InvalidSpec"), ("tp-too-wide", "Infeasible"),
                         ("impossible-slo", "Infeasible")):
        found = wait_until(partial(events, kube, namespace, name), 30, f"events of {name}")
        assert reason in {e["reason"] for e in found}
        assert get(kube, "deployment", namespace, name) is None

    apply(kube, namespace, base.read_text())  # a good one after the bad ones
    wait_condition(kube, namespace, "llama-8b-chat", "Planned", "True")
    assert wait_until(lambda: get(kube, "deployment", namespace, "llama-8b-chat"), 60, "the good Deployment")
    assert operator.thread.is_alive()


def test_a_plan_bigger_than_the_cluster_sets_insufficient_capacity(
        kube: Kube, operator: RunningOperator, namespace: str) -> None:
    document = resource(ROOT / "examples/llama-3.1-70b-h100.yaml",
                        **{"workload.requestsPerSecond": 150, "scaling.maxReplicas": 100})
    apply(kube, namespace, document)
    llmd = wait_condition(kube, namespace, "llama-70b", "InsufficientCapacity", "True")
    message = required_condition(llmd, "InsufficientCapacity")["message"]
    assert "NVIDIA-H100-80GB-HBM3" in message and "32 allocatable" in message
    wait_for_event(kube, namespace, "llama-70b", "InsufficientCapacity")


def test_deletion_removes_what_it_owns_and_never_touches_what_it_does_not(
        kube: Kube, operator: RunningOperator, namespace: str) -> None:
    kube.kubectl("create", "deployment", "llama-8b-chat", "-n", namespace, "--image=someone/else:1", check=True)
    foreign = get(kube, "deployment", namespace, "llama-8b-chat")
    assert foreign is not None
    apply(kube, namespace, (ROOT / "examples/llama-3.1-8b-l4.yaml").read_text())
    conflicted = wait_condition(kube, namespace, "llama-8b-chat", "Ready", "False")
    wait_until(lambda: required_condition(get(kube, "llmd", namespace, "llama-8b-chat"), "Ready")["reason"]
               == "NameConflict", 30, "NameConflict")
    assert conflicted is not None
    untouched = get(kube, "deployment", namespace, "llama-8b-chat")
    # The deployment controller keeps updating its status; its spec and owners are what kvscale must not touch.
    assert untouched is not None
    assert untouched["metadata"]["generation"] == foreign["metadata"]["generation"]
    assert untouched["spec"]["template"] == foreign["spec"]["template"]
    assert not untouched["metadata"].get("ownerReferences")

    apply(kube, namespace, (ROOT / "examples/llama-3.1-70b-h100.yaml").read_text())
    wait_until(lambda: get(kube, "deployment", namespace, "llama-70b"), 60, "the owned Deployment")
    kube.kubectl("delete", "llmd", "llama-70b", "-n", namespace, "--wait=true", check=True)
    wait_until(lambda: get(kube, "deployment", namespace, "llama-70b") is None, 60, "garbage collection")
    wait_until(lambda: get(kube, "service", namespace, "llama-70b") is None, 60, "garbage collection")
    kube.kubectl("delete", "llmd", "llama-8b-chat", "-n", namespace, "--wait=true", check=True)
    survivor = get(kube, "deployment", namespace, "llama-8b-chat")
    assert survivor is not None and survivor["metadata"]["uid"] == foreign["metadata"]["uid"]

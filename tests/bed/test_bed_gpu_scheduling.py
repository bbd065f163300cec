"""Issue 3 proof (1): kube-scheduler places GPU pods on the fake kwok GPU nodes by
`nvidia.com/gpu` allocatable and GPU-product labels; kwok makes them Running."""

from __future__ import annotations

from typing import Any

import pytest
from bedkit import Kube, wait_until
from kubernetes import client

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"

pytestmark = pytest.mark.bed


def gpu_deployment(name: str, replicas: int, gpus: int, product: str) -> client.V1Deployment:
    labels = {"app": name}
    container = client.V1Container(
        name="server",
        image="registry.invalid/kvscale/fake-vllm:0",  # never pulled: kwok fakes the kubelet
        resources=client.V1ResourceRequirements(
            requests={"nvidia.com/gpu": str(gpus)}, limits={"nvidia.com/gpu": str(gpus)}
        ),
    )
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[container], node_selector={"nvidia.com/gpu.product": product}),
            ),
        ),
    )


def pods_of(kube: Kube, namespace: str, app: str) -> list[Any]:
    pods: list[Any] = kube.core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    return pods


def wait_running(kube: Kube, namespace: str, app: str, count: int) -> list[Any]:
    def running() -> list[Any] | None:
        pods = [p for p in pods_of(kube, namespace, app) if p.metadata.deletion_timestamp is None]
        ok = len(pods) == count and all(p.status.phase == "Running" for p in pods)
        return pods if ok else None

    pods: list[Any] = wait_until(running, timeout=90, what=f"{count} Running pods of {app}")
    return pods


def test_gpu_pods_run_on_matching_fake_nodes(kube: Kube, namespace: str) -> None:
    kube.apps.create_namespaced_deployment(namespace, gpu_deployment("h100-tp4", 2, 4, H100))
    kube.apps.create_namespaced_deployment(namespace, gpu_deployment("l4-tp1", 1, 1, L4))

    h100_pods = wait_running(kube, namespace, "h100-tp4", 2)
    assert all(p.spec.node_name.startswith("gpu-h100-") for p in h100_pods), [p.spec.node_name for p in h100_pods]
    for pod in h100_pods:
        ready = {c.type: c.status for c in pod.status.conditions}
        assert ready.get("Ready") == "True"
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"

    (l4_pod,) = wait_running(kube, namespace, "l4-tp1", 1)
    assert l4_pod.spec.node_name.startswith("gpu-l4-")

    # The Deployment controller sees the kwok-made readiness.
    wait_until(
        lambda: kube.apps.read_namespaced_deployment_status("h100-tp4", namespace).status.available_replicas == 2,
        timeout=60,
        what="deployment h100-tp4 available",
    )


def test_too_many_gpus_stays_pending_unschedulable(kube: Kube, namespace: str) -> None:
    kube.apps.create_namespaced_deployment(namespace, gpu_deployment("h100-tp16", 1, 16, H100))

    def unschedulable() -> Any:
        for pod in pods_of(kube, namespace, "h100-tp16"):
            for cond in pod.status.conditions or []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    return pod, cond
        return None

    pod, cond = wait_until(unschedulable, timeout=60, what="PodScheduled=False on the 16-GPU pod")
    assert cond.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in cond.message
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None

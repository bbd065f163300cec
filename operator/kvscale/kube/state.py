"""Pure reading of live objects: ownership, drift of the pod template, GPU capacity of the nodes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from kvscale.catalog.gpus import GpuSpec
from kvscale.kube.builders import PRODUCT_LABEL_KEYS


def is_owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid and ref.get("controller") for ref in refs)


def _same_quantity(desired: Any, live: Any) -> bool:
    try:
        return bool(parse_quantity(str(desired)) == parse_quantity(str(live)))
    except ValueError:
        return str(desired) == str(live)


def _is_empty(value: Any) -> bool:
    return isinstance(value, Mapping | list) and not value


def is_subset(desired: Any, live: Any, path: tuple[str, ...] = ()) -> bool:
    """Whether every field kvscale sets has the same value live (the server may add defaults).

    Maps compare key by key, lists element by element and in full length, quantities under
    `resources` by value ("1000m" == "1").
    """
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        # The apiserver drops empty lists and maps: absent and empty are the same there.
        return all(is_subset(v, live[k], (*path, str(k))) if k in live else _is_empty(v) for k, v in desired.items())
    if isinstance(desired, Sequence) and not isinstance(desired, str):
        if not isinstance(live, Sequence) or isinstance(live, str) or len(desired) != len(live):
            return False
        return all(is_subset(d, item, path) for d, item in zip(desired, live, strict=True))
    if "resources" in path and isinstance(desired, str):
        return _same_quantity(desired, live)
    return bool(desired == live)


def template_drifted(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """True when the live Deployment's (or LeaderWorkerSet's) spec other than its replica count (pod templates,
    selector, rollout strategy) or its labels differ from what kvscale builds."""
    live_spec = live.get("spec") or {}
    return not (
        all(is_subset(value, live_spec.get(key, {})) for key, value in desired["spec"].items() if key != "replicas")
        and is_subset(desired["metadata"].get("labels", {}), (live.get("metadata") or {}).get("labels", {}))
    )


@dataclass(frozen=True)
class GpuCapacity:
    """Allocatable GPUs of one product in the cluster, counted from Ready, schedulable nodes."""

    product_label: str
    nodes: int
    gpus: int
    replica_slots: int  # replicas of `tensor_parallel` GPUs that fit, one replica per node at most its GPUs


def _node_ready(node: Mapping[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def count_gpu_capacity(nodes: Iterable[Mapping[str, Any]], gpu: GpuSpec, tensor_parallel: int) -> GpuCapacity:
    key = PRODUCT_LABEL_KEYS.get(gpu.resource_name, f"{gpu.resource_name}.product")
    count = gpus = slots = 0
    for node in nodes:
        labels = node.get("metadata", {}).get("labels") or {}
        if labels.get(key) != gpu.product_label or node.get("spec", {}).get("unschedulable"):
            continue
        if not _node_ready(node):
            continue
        allocatable = (node.get("status", {}).get("allocatable") or {}).get(gpu.resource_name, "0")
        per_node = int(Decimal(parse_quantity(allocatable)))
        count += 1
        gpus += per_node
        slots += per_node // max(tensor_parallel, 1)
    return GpuCapacity(product_label=gpu.product_label, nodes=count, gpus=gpus, replica_slots=slots)


def replica_counts(live: Mapping[str, Any] | None) -> tuple[int, int]:
    """(current, ready) replicas of a live Deployment; (0, 0) when there is none."""
    if not live:
        return 0, 0
    status = live.get("status") or {}
    return int(status.get("replicas") or 0), int(status.get("readyReplicas") or 0)


def _gpu_requests(pod: Mapping[str, Any], resource_name: str) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        requests = ((container.get("resources") or {}).get("requests")) or {}
        limits = ((container.get("resources") or {}).get("limits")) or {}
        value = requests.get(resource_name, limits.get(resource_name))
        if value is not None:
            total += int(Decimal(parse_quantity(value)))
    return total


def count_free_replica_slots(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], gpu: GpuSpec,
                             tensor_parallel: int) -> int:
    """Further replicas of `tensor_parallel` GPUs that the unrequested GPUs of the product hold, node by node.

    Pods bound to a node and not finished count against it; Pending pods are not bound and do not.
    """
    key = PRODUCT_LABEL_KEYS.get(gpu.resource_name, f"{gpu.resource_name}.product")
    used: dict[str, int] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node_name and phase not in ("Succeeded", "Failed"):
            used[node_name] = used.get(node_name, 0) + _gpu_requests(pod, gpu.resource_name)
    slots = 0
    for node in nodes:
        labels = node.get("metadata", {}).get("labels") or {}
        if labels.get(key) != gpu.product_label or node.get("spec", {}).get("unschedulable") or not _node_ready(node):
            continue
        allocatable = (node.get("status", {}).get("allocatable") or {}).get(gpu.resource_name, "0")
        free = int(Decimal(parse_quantity(allocatable))) - used.get(node["metadata"]["name"], 0)
        slots += max(free, 0) // max(tensor_parallel, 1)
    return slots


def _time_s(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_startups(pods: Iterable[Mapping[str, Any]], namespace: str, selector: Mapping[str, str],
                 ) -> list[tuple[str, float]]:
    """(pod name, seconds from creation to Ready) of the selected pods that are Ready, in the order they
    became Ready. The Ready condition's lastTransitionTime is its latest flip: measured the first time a
    pod is seen Ready (the caller keeps the first figure), it is the start-up."""
    found: list[tuple[float, str, float]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if meta.get("namespace") != namespace or any(labels.get(k) != v for k, v in selector.items()):
            continue
        ready = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is None or ready.get("status") != "True":
            continue
        created, became = _time_s(meta.get("creationTimestamp")), _time_s(ready.get("lastTransitionTime"))
        if created is None or became is None or became < created:
            continue
        found.append((became, str(meta.get("name")), became - created))
    return [(name, seconds) for _, name, seconds in sorted(found)]

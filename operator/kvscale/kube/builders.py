"""Pure builders of the Kubernetes objects an LLMDeployment owns: the serving Deployment and Service.

They return plain dicts (the API's JSON shape), so they need no kube client and tests compare
values directly; the writers in this package apply them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvscale.api.spec import API_GROUP, API_VERSION, KIND, LLMDeploymentSpec, Precision
from kvscale.catalog import GpuSpec
from kvscale.kube.drain import drain_lifecycle, longest_request_s, termination_grace_s
from kvscale.kube.engines import (
    COMMANDS,
    HEALTH_PATH,
    METRICS_PATH,
    SERVING_PORT,
    EngineLaunch,
    engine_args,
    image_for,
)
from kvscale.planner import Candidate

OWNER_LABEL = f"{API_GROUP}/llmdeployment"
# On a Deployment re-planning moved to (and its pods): which configuration it runs. Its selector has it, so
# the Deployment being replaced (whose selector is the owner label alone) and it never share a ReplicaSet.
CONFIGURATION_LABEL = f"{API_GROUP}/configuration"
SPEC_HASH_ANNOTATION = f"{API_GROUP}/spec-hash"
PORT_NAME = "http"
SHM_VOLUME = "dshm"

# Node label carrying the GPU product, by device-plugin resource (GPU feature discovery / AMD labeller).
PRODUCT_LABEL_KEYS: Mapping[str, str] = {
    "nvidia.com/gpu": "nvidia.com/gpu.product",
    "amd.com/gpu": "amd.com/gpu.product-name",
}

# Probes: weights of a large model take many minutes to download and load, so the startup probe
# allows up to an hour before liveness takes over; liveness then tolerates two minutes of stalls.
PROBE_PERIOD_S = 10
MODEL_LOAD_BUDGET_S = 3600


@dataclass(frozen=True)
class Owner:
    """The LLMDeployment that owns the built objects."""

    name: str
    namespace: str
    uid: str


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def selector_labels(owner: Owner) -> dict[str, str]:
    """Labels that select the pods: immutable in a Deployment, so nothing that a spec edit changes."""
    return {OWNER_LABEL: owner.name}


def selector_string(owner: Owner) -> str:
    """The pod selector in string form, for status.selector (the scale subresource)."""
    return ",".join(f"{key}={value}" for key, value in sorted(selector_labels(owner).items()))


def object_labels(owner: Owner, spec: LLMDeploymentSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": spec.serving.engine.value,
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/managed-by": "kvscale",
        **selector_labels(owner),
    }


def metadata_for(owner: Owner, spec: LLMDeploymentSpec) -> dict[str, Any]:
    return {
        "name": owner.name,
        "namespace": owner.namespace,
        "labels": object_labels(owner, spec),
        "ownerReferences": [owner_reference(owner)],
    }


class MultiNodeNotSupportedError(ValueError):
    """The plan's replicas span nodes: a Deployment cannot run them (kube.leaderworkerset builds those)."""


def scrape_annotations(spec_hash: str) -> dict[str, str]:
    """The serving pod's annotations: where its /metrics is, and the hash of its template (drift)."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(SERVING_PORT),
        "prometheus.io/path": METRICS_PATH,
        SPEC_HASH_ANNOTATION: spec_hash,
    }


def build_engine_launch(spec: LLMDeploymentSpec, chosen: Candidate, native_precision: Precision) -> EngineLaunch:
    return EngineLaunch(
        engine=spec.serving.engine,
        model_name=spec.model.name,
        tensor_parallel=chosen.tensor_parallel,
        max_num_seqs=chosen.max_num_seqs,
        max_model_len=chosen.max_model_len,
        gpu_memory_utilization=chosen.gpu_memory_utilization,
        precision=spec.model.precision or native_precision,
        native_precision=native_precision,
        kv_cache_dtype=spec.model.kv_cache_dtype,
        image=image_for(spec.serving.engine, spec.serving.image, multi_node=chosen.multi_node),
        pipeline_parallel=chosen.pipeline_parallel,
        data_parallel=chosen.data_parallel,
        data_parallel_local=chosen.data_parallel // chosen.data_parallel_nodes,
    )


def build_resources(spec: LLMDeploymentSpec, gpu: GpuSpec, tensor_parallel: int) -> dict[str, dict[str, str]]:
    """The user's requests/limits plus one GPU per tensor-parallel rank (the plan's count wins)."""
    gpus = {gpu.resource_name: str(tensor_parallel)}
    user = spec.serving.resources
    return {
        "requests": {**user.get("requests", {}), **gpus},
        "limits": {**user.get("limits", {}), **gpus},
    }


def build_node_selector(spec: LLMDeploymentSpec, gpu: GpuSpec) -> dict[str, str]:
    """The planned GPU product (which wins over a user entry for the same key) plus the user's labels."""
    key = PRODUCT_LABEL_KEYS.get(gpu.resource_name, f"{gpu.resource_name}.product")
    return {**spec.serving.node_selector, key: gpu.product_label}


def build_tolerations(spec: LLMDeploymentSpec, gpu: GpuSpec) -> list[dict[str, Any]]:
    """The user's tolerations, then the usual taint of GPU nodes unless already tolerated."""
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.serving.tolerations]
    default = {"key": gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"}
    return tolerations if default in tolerations else [*tolerations, default]


def _http_probe(period_s: int, failure_threshold: int, timeout_s: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failure_threshold,
    }


def build_probes() -> dict[str, dict[str, Any]]:
    return {
        "startupProbe": _http_probe(PROBE_PERIOD_S, MODEL_LOAD_BUDGET_S // PROBE_PERIOD_S),
        "readinessProbe": _http_probe(PROBE_PERIOD_S, 3),
        # Starts only once the startup probe passed, so it needs no long initial delay.
        "livenessProbe": _http_probe(30, 4, timeout_s=10),
    }


def build_container(spec: LLMDeploymentSpec, launch: EngineLaunch, gpu: GpuSpec, grace_s: int) -> dict[str, Any]:
    return {
        "name": launch.engine.value,
        "image": launch.image,
        "command": list(COMMANDS[launch.engine]),
        "args": engine_args(launch, list(spec.serving.extra_args)),
        "env": [{"name": e.name, "value": e.value} for e in spec.serving.env],
        "ports": [{"name": PORT_NAME, "containerPort": SERVING_PORT, "protocol": "TCP"}],
        "resources": build_resources(spec, gpu, launch.tensor_parallel * launch.data_parallel_local),
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
        **build_probes(),
        # a scale-down or rollout waits for the requests in flight instead of cutting them (kube/drain.py)
        "lifecycle": drain_lifecycle(launch.engine, SERVING_PORT, METRICS_PATH, grace_s),
    }


def grace_for(spec: LLMDeploymentSpec, chosen: Candidate) -> int:
    """terminationGracePeriodSeconds for the chosen configuration: long enough for its longest request."""
    predicted = chosen.predicted
    return termination_grace_s(longest_request_s(spec, chosen.max_model_len,
                                                 predicted.ttft_ms if predicted else None,
                                                 predicted.tpot_ms if predicted else None))


def build_pod_spec(spec: LLMDeploymentSpec, launch: EngineLaunch, gpu: GpuSpec, grace_s: int) -> dict[str, Any]:
    return pod_spec_around(spec, build_container(spec, launch, gpu, grace_s), gpu, grace_s)


def pod_spec_around(spec: LLMDeploymentSpec, container: dict[str, Any], gpu: GpuSpec, grace_s: int) -> dict[str, Any]:
    """A serving pod's spec around its engine container: placement on the planned GPUs, grace, /dev/shm."""
    return {
        "containers": [container],
        "terminationGracePeriodSeconds": grace_s,
        "nodeSelector": build_node_selector(spec, gpu),
        "tolerations": build_tolerations(spec, gpu),
        # NCCL and the engines' worker processes share tensors through /dev/shm; the 64 MiB
        # default of a container is far too small for tensor parallelism.
        "volumes": [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}],
    }


def compute_spec_hash(pod_spec: Mapping[str, Any]) -> str:
    """sha256 of the rendered pod spec (image, args, env, resources, placement). Replica counts are
    not in it, so the operator can tell a changed or drifted template from a scale."""
    canonical = json.dumps(pod_spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def build_deployment(
    owner: Owner,
    spec: LLMDeploymentSpec,
    chosen: Candidate,
    replicas: int,
    *,
    gpu: GpuSpec,
    native_precision: Precision,
    name: str | None = None,
    configuration_label: str | None = None,
) -> dict[str, Any]:
    """The serving Deployment for the plan's chosen candidate, running `replicas` pods.

    `gpu` is the catalog entry of `chosen.gpu_type` (node label, device resource);
    `native_precision` is the checkpoint's, to tell whether the engine must quantize on load.
    `name` and `configuration_label`: a Deployment re-planning moved to (default: the resource's name, and
    the owner label alone as its selector). Every one of them carries the owner label: the Service and the
    scale subresource select all of the resource's pods.
    A replica over several nodes (pipeline parallel) is not one pod: refused (MultiNodeNotSupportedError).
    """
    if chosen.multi_node:
        raise MultiNodeNotSupportedError(
            f"a replica of {chosen.layout} spans {chosen.nodes_per_replica} nodes: a single-pod Deployment "
            "cannot run it (build_leader_worker_set)")
    launch = build_engine_launch(spec, chosen, native_precision)
    pod_spec = build_pod_spec(spec, launch, gpu, grace_for(spec, chosen))
    extra = {CONFIGURATION_LABEL: configuration_label} if configuration_label else {}
    metadata = metadata_for(owner, spec)
    metadata["name"] = name or owner.name
    metadata["labels"].update(extra)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {**selector_labels(owner), **extra}},
            # GPUs are scarce and a cluster rarely has a spare replica's worth: a surge pod would sit
            # Pending and stall the rollout. Replace one pod at a time instead (capacity dips by one).
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": {**object_labels(owner, spec), **extra},
                    "annotations": scrape_annotations(compute_spec_hash(pod_spec)),
                },
                "spec": pod_spec,
            },
        },
    }


def build_service(owner: Owner, spec: LLMDeploymentSpec, selector: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A ClusterIP Service in front of the serving pods (`selector`: the pods that serve, all of the
    resource's pods by default; a LeaderWorkerSet's leaders), port 8000 named http."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata_for(owner, spec),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector) if selector is not None else selector_labels(owner),
            "ports": [{"name": PORT_NAME, "port": SERVING_PORT, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }

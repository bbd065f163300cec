"""The pure builder of a multi-node replica set: a LeaderWorkerSet (sigs.k8s.io/lws, API v1).

A replica over N nodes (pipeline stages, or data-parallel engines filling whole nodes) is one group of N
pods, one per node: the leader (worker
index 0) runs the engine's rank 0, serves the API and /metrics and takes the Service's traffic; the
workers join it headless. LWS scales whole groups (`spec.replicas` = replicas of the plan), recreates a
group when one of its pods restarts (the NCCL group cannot lose a rank), and gives each pod the leader's
address and its own index (LWS_LEADER_ADDRESS, LWS_WORKER_INDEX) through its pod webhook.
"""

from __future__ import annotations

import re
from typing import Any

from kvscale.api.spec import Engine, LLMDeploymentSpec, Precision
from kvscale.catalog import GpuSpec
from kvscale.kube.builders import (
    SPEC_HASH_ANNOTATION,
    Owner,
    build_container,
    build_engine_launch,
    compute_spec_hash,
    grace_for,
    metadata_for,
    object_labels,
    pod_spec_around,
    scrape_annotations,
    selector_labels,
)
from kvscale.kube.engines import engine_args, image_for, vllm_release_of, worker_command
from kvscale.planner import Candidate

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
# Set by LWS on every pod of a group; "0" is the leader.
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER_INDEX = "0"


def leader_worker_set_name(name: str) -> str:
    """The LeaderWorkerSet of LLMDeployment `name`. Not `name` itself: LWS gives its pods DNS names through a
    headless Service of the LWS's own name (the leader address the workers join), and `name` is the Service
    that clients use, as for a Deployment."""
    return f"{name}-lws"


# LWS's webhook requires its name to be a DNS-1035 label (it names the headless Service); each group is a
# StatefulSet `<lws>-<group>`, and a StatefulSet's name may be at most 52 characters (its pods' revision label).
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
STATEFUL_SET_NAME_MAX = 52
# vLLM's multi-node launch without Ray (--nnodes/--node-rank/--master-addr with --headless): PR #23691, first
# released in 0.11.1 (checked in the 0.11.0, 0.11.1, 0.11.2 and 0.12.0 wheels' vllm/engine/arg_utils.py).
MULTI_NODE_SINCE_VLLM = (0, 11, 1)


def multi_node_problems(name: str, spec: LLMDeploymentSpec) -> list[str]:
    """Why a LeaderWorkerSet for LLMDeployment `name` could not run, each with what to change; [] when it can."""
    problems = []
    lws = leader_worker_set_name(name)
    groups_digits = len(str(max(spec.scaling.max_replicas - 1, 0)))
    longest = STATEFUL_SET_NAME_MAX - 1 - groups_digits - len("-lws")
    if not _DNS_1035_LABEL.match(lws) or len(lws) + 1 + groups_digits > STATEFUL_SET_NAME_MAX:
        problems.append(
            f"the LeaderWorkerSet would be named {lws!r}, which LWS refuses: it must be a DNS-1035 label (lowercase "
            f"letters, digits and '-', starting with a letter) short enough for its groups' StatefulSets "
            f"({lws}-<group>, at most {STATEFUL_SET_NAME_MAX} characters): rename the LLMDeployment to such a name "
            f"of at most {longest} characters")
    image = image_for(spec.serving.engine, spec.serving.image, multi_node=True)
    release = vllm_release_of(image) if spec.serving.engine == Engine.VLLM else None
    if release is not None and release < MULTI_NODE_SINCE_VLLM:
        problems.append(
            f"spec.serving.image {image} runs vLLM {'.'.join(map(str, release))}, which has no multi-node launch "
            "without Ray (--nnodes, --node-rank, --master-addr: vLLM 0.11.1 or later): use a newer image")
    return problems


def leader_selector(owner: Owner) -> dict[str, str]:
    """The leaders of the resource's groups: the pods that serve requests and /metrics."""
    return {**selector_labels(owner), WORKER_INDEX_LABEL: LEADER_INDEX}


def _worker_container(leader: dict[str, Any], command: list[str], args: list[str]) -> dict[str, Any]:
    """A worker runs the same engine headless: no API, so no port, probes or drain (the group goes with
    its leader, which drains)."""
    kept = ("name", "image", "env", "resources", "volumeMounts")
    return {**{key: leader[key] for key in kept}, "command": command, "args": args}


def build_leader_worker_set(
    owner: Owner,
    spec: LLMDeploymentSpec,
    chosen: Candidate,
    replicas: int,
    *,
    gpu: GpuSpec,
    native_precision: Precision,
) -> dict[str, Any]:
    """The LeaderWorkerSet for a plan whose replicas span `chosen.nodes_per_replica` nodes, `replicas` groups."""
    launch = build_engine_launch(spec, chosen, native_precision)
    grace_s = grace_for(spec, chosen)
    leader_container = build_container(spec, launch, gpu, grace_s)
    leader_spec = pod_spec_around(spec, leader_container, gpu, grace_s)
    worker_args = engine_args(launch, list(spec.serving.extra_args), leader=False)
    worker = _worker_container(leader_container, worker_command(launch, list(leader_container["command"])), worker_args)
    worker_spec = pod_spec_around(spec, worker, gpu, grace_s)
    labels = object_labels(owner, spec)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": {**metadata_for(owner, spec), "name": leader_worker_set_name(owner.name)},
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            # as the Deployment's maxSurge 0: a surge group would need a whole spare set of nodes
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
            "leaderWorkerTemplate": {
                "size": chosen.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": labels,
                                 "annotations": scrape_annotations(compute_spec_hash(leader_spec))},
                    "spec": leader_spec,
                },
                "workerTemplate": {
                    "metadata": {"labels": labels,
                                 "annotations": {SPEC_HASH_ANNOTATION: compute_spec_hash(worker_spec)}},
                    "spec": worker_spec,
                },
            },
        },
    }

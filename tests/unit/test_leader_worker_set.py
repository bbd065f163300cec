"""Multi-node replicas as a LeaderWorkerSet: the builder, the engines' launch flags, and desire()."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from kvscale.api.conditions import ConditionType, find_condition
from kvscale.api.spec import Engine, KvCacheDtype, Precision, parse_spec
from kvscale.api.status import ConditionStatus
from kvscale.controllers.desire import desire
from kvscale.controllers.world import Intent, World, WriteKind
from kvscale.kube.builders import OWNER_LABEL, Owner, build_deployment
from kvscale.kube.engines import EngineLaunch, engine_args
from kvscale.kube.leaderworkerset import WORKER_INDEX_LABEL, build_leader_worker_set
from kvscale.planner import build_plan_inputs, plan_deployment

ROOT = Path(__file__).resolve().parents[2]
OWNER = Owner(name="llama-405b", namespace="team-a", uid="0b8e2c6a-0000-4000-8000-000000000405")
NOW = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
H100 = "NVIDIA-H100-80GB-HBM3"


def _spec_document(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "llama-3.1-405b-h100.yaml").read_text())["spec"]
    spec.update(changes)
    return spec


def _node(name: str, gpus: str = "8") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": H100}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": gpus}, "conditions": [{"type": "Ready", "status": "True"}]}}


def _world(spec: dict[str, Any] | None = None, *, nodes: int = 4, deployment: dict[str, Any] | None = None,
           leader_worker_set: dict[str, Any] | None = None, service: dict[str, Any] | None = None,
           status: dict[str, Any] | None = None) -> World:
    body: dict[str, Any] = {"apiVersion": "kvscale.dev/v1alpha1", "kind": "LLMDeployment",
                            "metadata": {"name": OWNER.name, "namespace": OWNER.namespace, "uid": OWNER.uid,
                                         "generation": 1, "resourceVersion": "7"},
                            "spec": spec or _spec_document()}
    if status is not None:
        body["status"] = status
    return World(body=body, deployment=deployment, service=service, nodes=[_node(f"n{i}") for i in range(nodes)],
                 config_map=None, now=NOW, leader_worker_set=leader_worker_set, leader_worker_sets_served=True)


def _written(intent: Intent, kind: WriteKind) -> dict[str, Any]:
    (write,) = [w for w in intent.writes if w.kind == kind]
    return dict(write.body)


def _live(body: dict[str, Any], uid: str = "live-uid") -> dict[str, Any]:
    live = copy.deepcopy(body)
    live["metadata"]["uid"] = uid
    return live


def test_a_405b_plan_becomes_a_leader_worker_set_of_two_node_groups() -> None:
    intent = desire(_world(), {})
    lws = _written(intent, WriteKind.LEADER_WORKER_SET)
    assert [w.kind for w in intent.writes] == [WriteKind.LEADER_WORKER_SET, WriteKind.SERVICE]
    images = {c["image"] for t in ("leaderTemplate", "workerTemplate")
              for c in lws["spec"]["leaderWorkerTemplate"][t]["spec"]["containers"]}
    assert images == {"vllm/vllm-openai:v0.11.1"}  # the first vLLM with --nnodes; single-node keeps v0.11.0
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["kind"] == "LeaderWorkerSet"
    assert lws["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    template = lws["spec"]["leaderWorkerTemplate"]
    desired = intent.status.desired_replicas
    assert template["size"] == 2 and desired is not None and lws["spec"]["replicas"] == desired >= 1
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    leader_args, worker_args = " ".join(leader["args"]), " ".join(worker["args"])
    for args in (leader_args, worker_args):
        assert "--tensor-parallel-size 8 " in args and "--pipeline-parallel-size 2 --nnodes 2" in args
        assert "--node-rank $(LWS_WORKER_INDEX) --master-addr $(LWS_LEADER_ADDRESS)" in args
    assert "--headless" in worker_args and "--headless" not in leader_args
    for container in (leader, worker):
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
    # only the leader serves: the API port, the probes, the drain and the scrape annotations
    assert "readinessProbe" in leader and "readinessProbe" not in worker and "ports" not in worker
    assert "lifecycle" in leader and "lifecycle" not in worker
    assert template["leaderTemplate"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert "prometheus.io/scrape" not in template["workerTemplate"]["metadata"]["annotations"]
    assert template["workerTemplate"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == H100
    service = _written(intent, WriteKind.SERVICE)
    assert service["spec"]["selector"] == {OWNER_LABEL: OWNER.name, WORKER_INDEX_LABEL: "0"}
    # LWS names its own headless Service (the pods' DNS, the leader address) after the LWS: not the client one
    assert lws["metadata"]["name"] == "llama-405b-lws" and service["metadata"]["name"] == "llama-405b"
    assert [e.reason for e in intent.writes[0].events] == ["LeaderWorkerSetCreated"]
    assert intent.deletes == ()


def test_sglang_workers_join_the_leaders_rendezvous() -> None:
    launch = EngineLaunch(engine=Engine.SGLANG, model_name="m", tensor_parallel=8, max_num_seqs=64,
                          max_model_len=8192, gpu_memory_utilization=0.9, precision=Precision.BF16,
                          native_precision=Precision.BF16, kv_cache_dtype=KvCacheDtype.AUTO,
                          image="lmsysorg/sglang:v0.5.4", pipeline_parallel=2)
    args = " ".join(engine_args(launch, [], leader=False))
    assert "--tp-size 8" in args and "--pp-size 2 --nnodes 2 --node-rank $(LWS_WORKER_INDEX)" in args
    assert "--dist-init-addr $(LWS_LEADER_ADDRESS):20000" in args
    single = " ".join(engine_args(EngineLaunch(**{**launch.__dict__, "pipeline_parallel": 1}), []))
    assert "--nnodes" not in single


def test_groups_are_counted_against_whole_nodes() -> None:
    """4 nodes of 8 H100 hold two 2-node groups of TP8; three groups do not fit."""
    three = _spec_document(scaling={"mode": "Off", "minReplicas": 1, "maxReplicas": 4}, replicas=3)
    intent = desire(_world(three), {})
    capacity = find_condition(intent.status.conditions, ConditionType.INSUFFICIENT_CAPACITY)
    assert capacity is not None and capacity.status == ConditionStatus.TRUE
    assert "3 x 16 H100-SXM (48 GPUs, 2 nodes x 8 per replica)" in capacity.message
    assert "room for 2 replica(s)" in capacity.message
    two = desire(_world(_spec_document(scaling={"mode": "Off", "minReplicas": 1, "maxReplicas": 4}, replicas=2)), {})
    fits = find_condition(two.status.conditions, ConditionType.INSUFFICIENT_CAPACITY)
    assert fits is not None and fits.status == ConditionStatus.FALSE
    assert "hold 2 replica(s) of 2 pods of 8 GPUs (TP8 PP2)" in fits.message


def test_drift_on_the_leader_worker_set_is_put_back_and_a_scale_is_a_scale() -> None:
    first = desire(_world(), {})
    lws = _written(first, WriteKind.LEADER_WORKER_SET)
    status = first.status.model_dump(by_alias=True, exclude_none=True, mode="json")
    live = _live(lws)
    live["status"] = {"replicas": 1, "readyReplicas": 1}
    service = _live(_written(first, WriteKind.SERVICE), "svc-uid")
    service["metadata"]["ownerReferences"] = lws["metadata"]["ownerReferences"]
    settled = desire(_world(leader_worker_set=live, service=service, status=status), {})
    assert settled.writes == () and settled.deletes == ()
    edited = copy.deepcopy(live)
    edited["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"].append("--enforce-eager")
    fixed = desire(_world(leader_worker_set=edited, service=service, status=status), {})
    (write,) = fixed.writes
    assert write.kind == WriteKind.LEADER_WORKER_SET and write.action == "update"
    assert [e.reason for e in write.events] == ["DriftCorrected"]


def test_moving_between_one_node_and_several_replaces_the_workload_without_orphans() -> None:
    single_spec = _spec_document(model={"name": "meta-llama/Llama-3.1-405B-Instruct", "precision": "fp8"})
    single_inputs = build_plan_inputs(parse_spec(single_spec))
    single_plan = plan_deployment(single_inputs)
    assert single_plan.chosen is not None and single_plan.chosen.pipeline_parallel == 1
    deployment = _live(build_deployment(OWNER, parse_spec(single_spec), single_plan.chosen, 1,
                                        gpu=single_inputs.gpus[0], native_precision=Precision.BF16), "dep-uid")
    old_service = {"metadata": {"name": OWNER.name, "uid": "svc-uid", "labels": deployment["metadata"]["labels"],
                                "ownerReferences": deployment["metadata"]["ownerReferences"]},
                   "spec": {"selector": {OWNER_LABEL: OWNER.name},
                            "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]}}
    # bf16: the plan spans two nodes; the owned Deployment goes once the LeaderWorkerSet is written
    to_groups = desire(_world(deployment=deployment, service=old_service), {})
    assert [w.kind for w in to_groups.writes] == [WriteKind.LEADER_WORKER_SET, WriteKind.SERVICE]
    assert _written(to_groups, WriteKind.SERVICE)["spec"]["selector"][WORKER_INDEX_LABEL] == "0"
    (gone,) = to_groups.deletes
    assert (gone.kind, gone.name, gone.uid) == (WriteKind.DEPLOYMENT, OWNER.name, "dep-uid")
    # and back: fp8 fits a node, the owned LeaderWorkerSet goes
    lws = _live(_written(to_groups, WriteKind.LEADER_WORKER_SET), "lws-uid")
    to_pods = desire(_world(single_spec, leader_worker_set=lws), {})
    assert [w.kind for w in to_pods.writes] == [WriteKind.DEPLOYMENT, WriteKind.SERVICE]
    (gone,) = to_pods.deletes
    assert (gone.kind, gone.uid) == (WriteKind.LEADER_WORKER_SET, "lws-uid")
    # someone else's Deployment of that name is never deleted
    foreign = {**deployment, "metadata": {**deployment["metadata"], "ownerReferences": []}}
    assert desire(_world(deployment=foreign), {}).deletes == ()


def test_a_leader_worker_set_kvscale_does_not_own_is_left_alone() -> None:
    lws = _live(build_leader_worker_set(OWNER, parse_spec(_spec_document()), _chosen(), 1,
                                        gpu=build_plan_inputs(parse_spec(_spec_document())).gpus[0],
                                        native_precision=Precision.BF16))
    lws["metadata"]["ownerReferences"] = []
    intent = desire(_world(leader_worker_set=lws), {})
    assert all(w.kind != WriteKind.LEADER_WORKER_SET for w in intent.writes)
    ready = find_condition(intent.status.conditions, ConditionType.READY)
    assert ready is not None and ready.reason == "NameConflict" and "LeaderWorkerSet" in ready.message


def _chosen() -> Any:
    plan = plan_deployment(build_plan_inputs(parse_spec(_spec_document())))
    assert plan.chosen is not None
    return plan.chosen


def _named(name: str, spec: dict[str, Any] | None = None) -> World:
    world = _world(spec)
    body = {**world.body, "metadata": {**world.body["metadata"], "name": name}}
    return World(body=body, deployment=None, service=None, nodes=world.nodes, config_map=None, now=NOW,
                 leader_worker_sets_served=True)


def test_a_name_or_image_lws_or_vllm_would_refuse_is_reported_and_nothing_is_written() -> None:
    for name, says in [("405b-llama", "DNS-1035"), ("l" * 47, "at most 46 characters"), ("llama.405b", "DNS-1035")]:
        intent = desire(_named(name), {})
        ready = find_condition(intent.status.conditions, ConditionType.READY)
        assert intent.writes == () and ready is not None, name
        assert ready.reason == "MultiNodeNotRunnable" and says in ready.message and "rename" in ready.message, name
        assert [e.reason for e in intent.events].count("MultiNodeNotRunnable") == 1
    # the longest that fits: groups 0-3 (maxReplicas 4) -> "<46>-lws-3" is 52 characters
    assert desire(_named("l" * 46), {}).writes
    old = _spec_document(serving={"image": "vllm/vllm-openai:v0.11.0"})  # the single-node default: no --nnodes
    ready = find_condition(desire(_world(old), {}).status.conditions, ConditionType.READY)
    assert ready is not None and ready.reason == "MultiNodeNotRunnable" and "vLLM 0.11.0" in ready.message
    # an image whose release is unknown is trusted, and a single-node plan is not held to LWS's naming rules
    assert desire(_world(_spec_document(serving={"image": "registry.local/serving:prod"})), {}).writes
    fp8 = _spec_document(model={"name": "meta-llama/Llama-3.1-405B-Instruct", "precision": "fp8"})
    assert next(w.kind for w in desire(_named("405b-llama", fp8), {}).writes) == WriteKind.DEPLOYMENT

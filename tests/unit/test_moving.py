"""Moving to a re-planned configuration (issue 17, replan: Auto), pass by pass against a small fake cluster."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kvscale.api.spec import parse_spec
from kvscale.api.status import CalibrationStatus, LLMDeploymentStatus, MovePhase
from kvscale.autoscaler import ScalingHistory
from kvscale.autoscaler.forecast import ForecastState
from kvscale.controllers.autoscaling import ScalingInput
from kvscale.controllers.desire import desire, plan_cached
from kvscale.controllers.world import Intent, World, WriteKind
from kvscale.kube.builders import CONFIGURATION_LABEL, OWNER_LABEL, Owner, build_deployment, build_service

T0 = datetime(2026, 3, 2, 9, 0, 0, tzinfo=UTC)
UID = "0b8e2c6a-0000-4000-8000-0000000000bb"
OWNER = Owner(name="llama-8b", namespace="team-a", uid=UID)
STEP = timedelta(seconds=30)


def spec_dict(**scaling: Any) -> dict[str, Any]:
    """Llama-3.1-8B declared for 1,024/256 tokens at 2 req/s, on H100 or L4 (the planner picks 4 x L4)."""
    return {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "precision": "bf16"},
            "gpu": {"types": ["H100-SXM", "L4"], "perNode": 8},
            "slo": {"ttftMs": 2500, "tpotMs": 50, "percentile": 95},
            "workload": {"requestsPerSecond": 2, "inputTokens": 1024, "outputTokens": 256, "maxContextTokens": 8192},
            "scaling": {"minReplicas": 1, "maxReplicas": 8, "replan": "Auto", "replanSustainSeconds": 60,
                        "replanIntervalSeconds": 30, "replanMinHistorySeconds": 600, **scaling}}


def node(name: str, product: str, gpus: int = 8) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


L4_NODES = [node(f"l4-{i}", "NVIDIA-L4") for i in range(2)]
H100_NODES = [node(f"h100-{i}", "NVIDIA-H100-80GB-HBM3") for i in range(2)]


@dataclass
class FakeCluster:
    """Deployments by name; each becomes Ready `ready_after` passes after it was last scaled up."""

    spec: dict[str, Any]
    nodes: list[dict[str, Any]]
    status: LLMDeploymentStatus
    now: datetime = T0
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    ready_after: dict[str, int] = field(default_factory=dict)
    ready_in: int = 2  # passes
    never_ready: bool = False
    generation: int = 1
    timeline: list[tuple[int, int, int, int]] = field(default_factory=list)  # (old, old ready, new, new ready)
    events: list[str] = field(default_factory=list)

    def world(self) -> World:
        status = self.status
        active = status.serving.deployment if status.serving is not None else OWNER.name
        target = status.move.to.deployment if status.move is not None else None
        forecasts = ForecastState()
        for minute in range(31):
            forecasts = forecasts.observe(self.now.timestamp() - 60.0 * (30 - minute), 1.0)
        scaling = ScalingInput(observation=None, metrics_problem=None, prefill_s=None,
                               history=replace(ScalingHistory(), forecasts=forecasts), now_s=self.now.timestamp(),
                               bound_pods=[])
        body = {"apiVersion": "kvscale.dev/v1alpha1", "kind": "LLMDeployment",
                "metadata": {"name": OWNER.name, "namespace": OWNER.namespace, "uid": UID,
                             "generation": self.generation},
                "spec": self.spec, "status": status.model_dump(by_alias=True, exclude_none=True, mode="json")}
        return World(body=body, deployment=copy.deepcopy(self.deployments.get(active)),
                     service=build_service(OWNER, parse_spec(self.spec)), nodes=self.nodes, config_map=None,
                     now=self.now, scaling=scaling,
                     move_target=copy.deepcopy(self.deployments.get(target)) if target else None,
                     labelled_deployments=[copy.deepcopy(d) for d in self.deployments.values()])

    def apply(self, intent: Intent) -> None:
        for write in intent.writes:
            if write.kind != WriteKind.DEPLOYMENT:
                continue
            body = copy.deepcopy(dict(write.body))
            name = body["metadata"]["name"]
            old = self.deployments.get(name)
            wanted = body["spec"]["replicas"]
            had = (old or {}).get("status", {"replicas": 0, "readyReplicas": 0})
            if wanted > had["replicas"]:
                self.ready_after[name] = self.ready_in
            body["status"] = {"replicas": min(wanted, had["replicas"]) if wanted > had["replicas"] else wanted,
                              "readyReplicas": min(had["readyReplicas"], wanted)}
            self.deployments[name] = body
        for delete in intent.deletes:
            assert self.deployments[delete.name]["metadata"].get("uid", delete.uid) == delete.uid
            del self.deployments[delete.name]
        self.status = intent.status
        self.events += [e.reason for e in intent.events]

    def tick(self) -> Intent:
        """One pass: pods come up, the operator decides, the cluster applies."""
        for name, left in list(self.ready_after.items()):
            d = self.deployments.get(name)
            if d is None:
                continue
            if left <= 1 and not (self.never_ready and CONFIGURATION_LABEL in d["metadata"]["labels"]):
                d["status"] = {"replicas": d["spec"]["replicas"], "readyReplicas": d["spec"]["replicas"]}
                del self.ready_after[name]
            else:
                self.ready_after[name] = left - 1
                d["status"]["replicas"] = d["spec"]["replicas"]
        for name, d in self.deployments.items():  # uids, as the API server gives them
            d["metadata"].setdefault("uid", f"uid-{name}")
        intent = desire(self.world(), {})
        self.apply(intent)
        old = self.deployments.get(OWNER.name, {}).get("status", {})
        new = [d["status"] for n, d in self.deployments.items() if n != OWNER.name]
        self.timeline.append((old.get("replicas", 0), old.get("readyReplicas", 0),
                              sum(s["replicas"] for s in new), sum(s["readyReplicas"] for s in new)))
        self.now += STEP
        return intent


def served_long_prompts() -> LLMDeploymentStatus:
    """Calibration says the served traffic is 6,000/150 tokens (the spec declares 1,024/256)."""
    return LLMDeploymentStatus(observed_generation=1, calibration=CalibrationStatus(
        decode_factor=1.0, prefill_factor=1.0, tpot_tail_factor=1.0, ttft_tail_factor=1.0, fitted_windows=10,
        input_tokens=6000.0, output_tokens=150.0))


def running_cluster(spec: dict[str, Any], nodes: list[dict[str, Any]]) -> FakeCluster:
    parsed = parse_spec(spec)
    inputs, plan = plan_cached(parsed, None, {})
    assert plan.chosen is not None and plan.chosen.gpu_type == "L4"
    gpu = next(g for g in inputs.gpus if g.name == "L4")
    deployment = build_deployment(OWNER, parsed, plan.chosen, 2, gpu=gpu, native_precision=inputs.arch.native_precision)
    deployment["status"] = {"replicas": 2, "readyReplicas": 2}
    deployment["metadata"]["uid"] = "uid-old"
    cluster = FakeCluster(spec=spec, nodes=nodes, status=served_long_prompts())
    cluster.deployments[OWNER.name] = deployment
    return cluster


def test_auto_moves_to_the_recommended_configuration_without_dropping_capacity() -> None:
    cluster = running_cluster(spec_dict(), L4_NODES + H100_NODES)
    for _ in range(20):
        cluster.tick()
        if cluster.status.serving is not None:
            break
    assert cluster.events.count("MoveStarted") == 1 and cluster.events.count("MoveSwitched") == 1
    assert cluster.events.count("MoveCompleted") == 1 and "MoveRolledBack" not in cluster.events
    serving = cluster.status.serving
    assert serving is not None and serving.gpu_type == "H100-SXM" and cluster.status.move is None
    assert OWNER.name not in cluster.deployments  # the old Deployment drained and went
    new = cluster.deployments[serving.deployment]
    assert new["spec"]["selector"]["matchLabels"] == {OWNER_LABEL: OWNER.name, CONFIGURATION_LABEL: serving.label}
    args = " ".join(new["spec"]["template"]["spec"]["containers"][0]["args"])
    assert f"--tensor-parallel-size {serving.tensor_parallel} --max-num-seqs {serving.max_num_seqs}" in args
    # Capacity: the old fleet kept its 2 Ready replicas until the new one was all Ready.
    started = next(i for i, (_, _, new_n, _) in enumerate(cluster.timeline) if new_n > 0)
    switched = next(i for i, (old_n, _, _, _) in enumerate(cluster.timeline) if i > started and old_n == 0)
    assert all(old_ready >= 2 for _, old_ready, _, _ in cluster.timeline[:switched])
    assert cluster.timeline[switched][3] >= 1  # the new fleet was Ready when the old one went to 0
    # Settled: the next passes rewrite nothing (the Deployment the move made is what the plan builds).
    for _ in range(3):
        intent = cluster.tick()
        assert not [w for w in intent.writes if w.kind == WriteKind.DEPLOYMENT], intent.writes
        assert not intent.deletes
    assert cluster.status.plan is not None and cluster.status.plan.gpu_type == "H100-SXM"
    assert cluster.events.count("MoveStarted") == 1  # the recommendation is now what runs: no second move


def test_no_room_for_both_fleets_blocks_the_move_and_says_why() -> None:
    cluster = running_cluster(spec_dict(), L4_NODES)  # no H100 node
    for _ in range(8):
        cluster.tick()
    rec = cluster.status.recommendation
    assert rec is not None and rec.recommended and cluster.status.move is None
    assert rec.move_blocked is not None and "the cluster has room for 0" in rec.move_blocked
    assert cluster.events.count("MoveBlocked") == 1 and list(cluster.deployments) == [OWNER.name]


def test_a_move_that_never_gets_ready_is_rolled_back_and_not_retried_before_the_interval() -> None:
    cluster = running_cluster(spec_dict(replanMoveTimeoutSeconds=120, replanMoveIntervalSeconds=3600),
                              L4_NODES + H100_NODES)
    cluster.never_ready = True
    for _ in range(16):
        cluster.tick()
    assert cluster.events.count("MoveStarted") == 1 and cluster.events.count("MoveRolledBack") == 1
    assert list(cluster.deployments) == [OWNER.name] and cluster.status.move is None
    assert cluster.status.last_move_at is not None and cluster.status.serving is None
    rec = cluster.status.recommendation
    assert rec is not None and rec.move_blocked is not None and "replanMoveIntervalSeconds" in rec.move_blocked
    assert all(old_ready >= 2 for _, old_ready, _, _ in cluster.timeline)


def test_a_spec_edit_mid_move_rolls_it_back() -> None:
    cluster = running_cluster(spec_dict(), L4_NODES + H100_NODES)
    cluster.ready_in = 50
    while cluster.status.move is None:
        cluster.tick()
    assert cluster.status.move.phase == MovePhase.STARTING and len(cluster.deployments) == 2
    cluster.generation = 2
    cluster.tick()
    assert "MoveRolledBack" in cluster.events and list(cluster.deployments) == [OWNER.name]


def test_a_restarted_operator_resumes_a_move_from_status() -> None:
    cluster = running_cluster(spec_dict(), L4_NODES + H100_NODES)
    while cluster.status.move is None:
        cluster.tick()
    # The operator died after writing status but the new Deployment was lost (deleted by hand, say):
    target = cluster.status.move.to.deployment
    del cluster.deployments[target]
    cluster.tick()
    assert target in cluster.deployments  # created again from what status.move says
    for _ in range(12):
        cluster.tick()
    assert cluster.status.serving is not None and cluster.status.serving.deployment == target
    assert list(cluster.deployments) == [target]


def test_after_a_spec_edit_a_second_move_gets_its_own_deployment() -> None:
    # The moved Deployment keeps its name across a spec edit and runs the spec's plan again; a later move to
    # the same configuration must not land on that name (its label carries the spec generation).
    cluster = running_cluster(spec_dict(replanMoveIntervalSeconds=60), L4_NODES + H100_NODES)
    while cluster.status.serving is None:
        cluster.tick()
    first = cluster.status.serving.deployment
    cluster.generation = 2
    cluster.spec = {**cluster.spec, "scaling": {**cluster.spec["scaling"], "headroom": 0.15}}
    for _ in range(30):
        intent = cluster.tick()
        names = [w.body["metadata"]["name"] for w in intent.writes if w.kind == WriteKind.DEPLOYMENT]
        assert len(names) == len(set(names)), names  # never two writes of one Deployment in a pass
        if cluster.status.serving is not None and cluster.status.serving.generation == 2:
            break
    serving = cluster.status.serving
    assert serving is not None and serving.generation == 2 and serving.deployment != first
    assert serving.gpu_type == "H100-SXM" and list(cluster.deployments) == [serving.deployment]
    assert cluster.events.count("MoveCompleted") == 2 and "MoveRolledBack" not in cluster.events

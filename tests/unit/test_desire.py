"""The reconcile decision as a value: `desire(World) -> Intent`, and `settle` after the writes.

The core of these tests is one table: eight states a resource can be in (invalid, infeasible,
rolling out, ready, short of GPUs, metrics gone, a write refused, a name taken), and every ordered
pair of them. From the status state A left, a pass over state B's world must leave no field that
B does not have (no stale prediction, plan or condition), converge to B's own status within two
passes, keep lastTransitionTime for conditions that did not flip, say a problem once in an Event,
and then write nothing more.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvscale.api.conditions import ConditionType, find_condition
from kvscale.api.spec import parse_spec
from kvscale.api.status import ConditionStatus, LLMDeploymentStatus
from kvscale.autoscaler import ScalingHistory
from kvscale.controllers.autoscaling import ScalingInput
from kvscale.controllers.backoff import BACKOFF_BASE_S, BACKOFF_MAX_S, Backoff, fingerprint
from kvscale.controllers.desire import (
    decide_replicas,
    desire,
    plan_cached,
    previous_status,
    same_status,
    settle,
    status_dict,
)
from kvscale.controllers.world import Intent, World, WriteFailure, WriteKind
from kvscale.kube.builders import Owner, build_deployment, build_service

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "llama-3.1-70b-h100.yaml").read_text())
# Twice the example's traffic: a plan of several replicas, which the scale-down tests need (at 10 req/s
# one TP8 replica can carry it all).
EXAMPLE["spec"]["workload"]["requestsPerSecond"] = 20
T0 = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
UID = "0b8e2c6a-0000-4000-8000-000000000001"
OWNER = Owner(name="llama-70b", namespace="team-a", uid=UID)
REFUSED = WriteFailure(WriteKind.SERVICE, "create", 500, "500 Internal error: range is full")


def h100_node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


NODES = [h100_node(f"gpu-h100-{i}") for i in range(4)]


def spec_with(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(yaml.safe_dump(EXAMPLE["spec"]))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = spec
        for key in parents:
            node = node[key]
        node[leaf] = value
    return spec


def body(spec: dict[str, Any], status: LLMDeploymentStatus | None = None, generation: int = 1) -> dict[str, Any]:
    found: dict[str, Any] = {
        "apiVersion": "kvscale.dev/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": OWNER.name, "namespace": OWNER.namespace, "uid": UID, "generation": generation,
                     "resourceVersion": "7"},
        "spec": spec}
    if status is not None:
        found["status"] = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return found


def owned_deployment(spec: dict[str, Any], ready: int) -> dict[str, Any]:
    parsed = parse_spec(spec)
    inputs, plan = plan_cached(parsed, None, {})
    assert plan.chosen is not None
    gpu = next(g for g in inputs.gpus if g.name == plan.chosen.gpu_type)
    deployment = build_deployment(OWNER, parsed, plan.chosen, plan.chosen.replicas, gpu=gpu,
                                  native_precision=inputs.arch.native_precision)
    deployment["status"] = {"replicas": plan.chosen.replicas, "readyReplicas": ready}
    return deployment


def owned_service(spec: dict[str, Any]) -> dict[str, Any]:
    return build_service(OWNER, parse_spec(spec))


FEASIBLE = spec_with()
PLANNED_REPLICAS = plan_cached(parse_spec(FEASIBLE), None, {})[1].chosen.replicas  # type: ignore[union-attr]


@dataclass(frozen=True)
class State:
    """One state of a resource: its world (less the status) and what the edge's writes do in it."""

    name: str
    spec: dict[str, Any]
    deployment: Mapping[str, Any] | None
    service: Mapping[str, Any] | None
    nodes: tuple[Mapping[str, Any], ...] = tuple(NODES)
    generation: int = 1
    scaling: ScalingInput | None = None
    refuse: Callable[[Intent], list[WriteFailure]] = lambda intent: []

    def world(self, previous: LLMDeploymentStatus | None, now: datetime) -> World:
        return World(body=body(self.spec, previous, self.generation), deployment=self.deployment,
                     service=self.service, nodes=self.nodes, config_map=None, now=now, scaling=self.scaling)


def metrics_gone(now_s: float) -> ScalingInput:
    return ScalingInput(observation=None, metrics_problem="Prometheus at http://prom:9090 failed: connection refused",
                        prefill_s=None, history=ScalingHistory(), now_s=now_s, bound_pods=[])


def refuse_service(intent: Intent) -> list[WriteFailure]:
    return [REFUSED for w in intent.writes if w.kind == WriteKind.SERVICE]


STATES = [
    State("invalid", spec_with(**{"model.name": "acme/NoSuchModel-7B"}), owned_deployment(FEASIBLE, 1),
          owned_service(FEASIBLE), generation=3),
    State("infeasible", spec_with(**{"slo.tpotMs": 1}), owned_deployment(FEASIBLE, 1), owned_service(FEASIBLE),
          generation=2),
    State("rolling-out", FEASIBLE, owned_deployment(FEASIBLE, 0), owned_service(FEASIBLE)),
    State("ready", FEASIBLE, owned_deployment(FEASIBLE, PLANNED_REPLICAS), owned_service(FEASIBLE)),
    State("no-gpus", FEASIBLE, owned_deployment(FEASIBLE, 0), owned_service(FEASIBLE),
          nodes=(h100_node("gpu-h100-0", gpus=4),)),
    State("metrics-gone", FEASIBLE, owned_deployment(FEASIBLE, PLANNED_REPLICAS), owned_service(FEASIBLE),
          scaling=metrics_gone(T0.timestamp())),
    State("service-refused", FEASIBLE, owned_deployment(FEASIBLE, PLANNED_REPLICAS), None, refuse=refuse_service),
    State("name-taken", FEASIBLE, {"metadata": {"name": OWNER.name, "namespace": OWNER.namespace}, "spec": {}},
          owned_service(FEASIBLE)),
]
BY_NAME = {s.name: s for s in STATES}

# The problem condition each state raises (True), with the Event reason that tells it.
PROBLEMS = {
    "invalid": (ConditionType.INVALID_SPEC, "InvalidSpec"),
    "infeasible": (ConditionType.INFEASIBLE, "Infeasible"),
    "no-gpus": (ConditionType.INSUFFICIENT_CAPACITY, "InsufficientCapacity"),
    "metrics-gone": (ConditionType.METRICS_UNAVAILABLE, "MetricsUnavailable"),
    "service-refused": (ConditionType.WRITE_FAILED, "WriteFailed"),
}


def run_pass(state: State, previous: LLMDeploymentStatus | None, now: datetime) -> tuple[World, Intent]:
    """One pass as the edge runs it: desire, the writes (refused as the state says), settle."""
    world = state.world(previous, now)
    intent = desire(world, {})
    return world, settle(intent, world, state.refuse(intent))


def settled_status(state: State) -> LLMDeploymentStatus:
    """The status a state converges to from nothing: passes until nothing changes."""
    status: LLMDeploymentStatus | None = None
    for step in range(4):
        _, intent = run_pass(state, status, T0 + timedelta(minutes=step))
        if same_status(status, intent.status):
            return intent.status
        status = intent.status
    raise AssertionError(f"{state.name} does not settle: {status}")


SETTLED = {s.name: settled_status(s) for s in STATES}


def present(status: LLMDeploymentStatus) -> set[str]:
    return {k for k, v in status.model_dump(exclude={"conditions"}).items() if v is not None}


# What a pass without fresh metrics (any pass but the resync's) keeps from the last one that had them,
# as long as a plan is served: the last observation and its verdict.
METRIC_FIELDS = {"observed", "slo_met"}
METRIC_CONDITIONS = {ConditionType.METRICS_UNAVAILABLE}


def carries_metrics(state: State) -> bool:
    return state.scaling is None and state.name not in ("invalid", "infeasible")


def comparable(status: LLMDeploymentStatus, carried: bool) -> dict[str, Any]:
    """The status without the parts that legitimately depend on the path: transition times, what
    outlives every state (the calibration and the last scale decision) and, in a pass without fresh
    metrics, the last metrics and their verdict."""
    dumped = status.model_dump(mode="json", exclude={"calibration", "last_scale_decision",
                                                     *(METRIC_FIELDS if carried else ())})
    dumped["conditions"] = [{k: v for k, v in c.items() if k != "last_transition_time"}
                            for c in dumped["conditions"] if not (carried and c["type"] in METRIC_CONDITIONS)]
    return dumped


def test_every_state_settles_to_what_it_says() -> None:
    def condition(name: str, type_: str) -> tuple[str, str] | None:
        found = find_condition(SETTLED[name].conditions, type_)
        return None if found is None else (found.status.value, found.reason)

    assert condition("invalid", "InvalidSpec") == ("True", "InvalidSpec")
    assert condition("infeasible", "Infeasible") == ("True", "TpotUnreachable")
    assert condition("rolling-out", "Ready") == ("False", "ReplicasNotReady")
    assert condition("ready", "Ready") == ("True", "ReplicasReady")
    assert condition("no-gpus", "InsufficientCapacity") == ("True", "NotEnoughGpus")
    assert condition("metrics-gone", "MetricsUnavailable") == ("True", "NoUsableMetrics")
    assert condition("service-refused", "WriteFailed") == ("True", "ServiceWriteFailed")
    assert condition("name-taken", "Ready") == ("False", "NameConflict")
    for name in ("invalid", "infeasible"):
        assert {"predicted", "desired_replicas", "ttft_at_slo_percentile_ms", "ttft_p95_ms", "observed"}.isdisjoint(
            present(SETTLED[name]))
    assert SETTLED["invalid"].plan is None
    assert SETTLED["ready"].desired_replicas == PLANNED_REPLICAS
    refused = find_condition(SETTLED["service-refused"].conditions, "WriteFailed")
    assert refused is not None and "range is full" in refused.message and "back-off" in refused.message


@pytest.mark.parametrize(("before", "after"), list(itertools.product(BY_NAME, BY_NAME)))
def test_a_transition_leaves_nothing_stale_and_settles(before: str, after: str) -> None:
    start, target = SETTLED[before], BY_NAME[after]
    t1, t2, t3 = T0 + timedelta(hours=1), T0 + timedelta(hours=2), T0 + timedelta(hours=3)

    carried = carries_metrics(target)
    _, first = run_pass(target, start, t1)
    # Nothing of the old state that the new one lacks: fields and condition types.
    fields, types = present(SETTLED[after]), {c.type for c in SETTLED[after].conditions}
    if carried:
        fields, types = fields | METRIC_FIELDS, types | METRIC_CONDITIONS
    assert present(first.status) <= fields, present(first.status) - fields
    assert {c.type for c in first.status.conditions} <= types
    # A condition that did not flip keeps the time of its last transition; one that flipped moves.
    for condition in first.status.conditions:
        old = find_condition(start.conditions, condition.type)
        kept = old is not None and old.status == condition.status
        assert condition.last_transition_time == (old.last_transition_time if old is not None and kept
                                                  else "2026-01-05T10:00:00Z")

    _, second = run_pass(target, first.status, t2)
    assert comparable(second.status, carried) == comparable(SETTLED[after], carried)
    # Settled: a further pass changes nothing, writes only what the state refuses, and tells nothing new.
    _, third = run_pass(target, second.status, t3)
    assert same_status(second.status, third.status)
    assert [w.kind for w in third.writes] == ([WriteKind.SERVICE] if after == "service-refused" else [])
    assert third.events == ()
    problem = PROBLEMS.get(after)
    if problem is not None:  # a problem raised by this transition is told once, in the pass that raised it
        type_, reason = problem
        old = find_condition(start.conditions, type_)
        raised = old is None or old.status != ConditionStatus.TRUE
        told = [e for e in (*first.events, *second.events) if e.reason == reason and e.type == "Warning"]
        assert len(told) == (1 if raised else 0), (first.events, second.events)


def test_planned_writes_create_what_is_missing_and_nothing_else() -> None:
    world = replace(BY_NAME["ready"].world(None, T0), deployment=None, service=None)
    intent = desire(world, {})
    assert [(w.kind, w.action) for w in intent.writes] == [(WriteKind.DEPLOYMENT, "create"),
                                                          (WriteKind.SERVICE, "create")]
    deployment = intent.writes[0].body
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == UID
    assert deployment["spec"]["replicas"] == PLANNED_REPLICAS
    assert [e.reason for e in intent.writes[0].events] == ["DeploymentCreated"]
    assert intent.tracks_writes


def test_a_changed_spec_rolls_the_deployment_and_an_edit_is_drift() -> None:
    ready = BY_NAME["ready"]
    tighter = spec_with(**{"slo.tpotMs": 20})  # the plan changes max-num-seqs (768, from 256)
    rolled = desire(replace(ready.world(SETTLED["ready"], T0), body=body(tighter, SETTLED["ready"], 2)), {})
    [write] = rolled.writes
    assert (write.kind, write.action) == (WriteKind.DEPLOYMENT, "update")
    assert write.events[0].reason == "DeploymentUpdated"  # (and Scaled: the new plan has more)

    edited = owned_deployment(FEASIBLE, PLANNED_REPLICAS)
    edited["spec"]["template"]["spec"]["containers"][0]["args"] = ["--max-num-seqs", "7"]
    drift = desire(replace(ready.world(SETTLED["ready"], T0), deployment=edited), {})
    [write] = drift.writes
    assert [e.reason for e in write.events] == ["DriftCorrected"]


def test_foreign_objects_are_never_written() -> None:
    taken = run_pass(BY_NAME["name-taken"], None, T0)[1]
    assert taken.writes == () and not taken.tracks_writes
    foreign_service = {"metadata": {"name": OWNER.name, "ownerReferences": []}, "spec": {"selector": {"x": "y"}}}
    world = replace(BY_NAME["ready"].world(SETTLED["ready"], T0), service=foreign_service)
    assert desire(world, {}).writes == ()


def test_a_planned_status_reports_the_chosen_candidate_and_its_predictions() -> None:
    _, plan = plan_cached(parse_spec(FEASIBLE), None, {})
    chosen = plan.chosen
    assert chosen is not None and chosen.predicted is not None
    status = SETTLED["ready"]
    reported = status.plan
    assert reported is not None and reported.feasible
    assert (reported.gpu_type, reported.tensor_parallel, reported.max_num_seqs, reported.max_model_len) == (
        chosen.gpu_type, chosen.tensor_parallel, chosen.max_num_seqs, chosen.max_model_len)
    assert (reported.replicas, reported.gpus) == (chosen.replicas, chosen.gpus)
    assert reported.cost_per_hour == pytest.approx(chosen.cost_per_hour, abs=1e-3)
    assert (reported.binding_constraint, reported.explanation) == (plan.binding_constraint, plan.explanation)
    assert status.predicted is not None
    assert status.predicted.ttft_ms == pytest.approx(chosen.predicted.ttft_ms, abs=0.01)
    assert status.predicted.tpot_ms == pytest.approx(chosen.predicted.tpot_ms, abs=0.001)
    # Before any metrics the printer columns show the prediction.
    assert (status.ttft_at_slo_percentile_ms, status.tpot_at_slo_percentile_ms) == (
        status.predicted.ttft_ms, status.predicted.tpot_ms)
    # ... and the deprecated names of the same fields too, for a release.
    assert (status.ttft_p95_ms, status.tpot_p95_ms) == (status.predicted.ttft_ms, status.predicted.tpot_ms)
    planned = find_condition(status.conditions, ConditionType.PLANNED)
    assert planned is not None and (planned.reason, planned.message) == ("PlanFound", plan.explanation)
    assert planned.observed_generation == status.observed_generation == 1
    wire = status_dict(status)
    assert {"observedGeneration", "desiredReplicas", "ttftAtSloPercentileMs", "ttftP95Ms", "conditions"} <= set(wire)
    assert wire["plan"]["gpuType"] == "H100-SXM" and "phase" not in wire


def test_the_status_write_clears_what_no_longer_applies() -> None:
    """A merge patch removes a field only when it is sent as null: every absent field is sent so."""
    wire = status_dict(SETTLED["infeasible"])
    assert wire["predicted"] is None and wire["desiredReplicas"] is None and wire["observed"] is None
    assert wire["plan"]["gpuType"] is None  # nested too: the old plan's GPU must go
    assert previous_status({"status": {**wire, "kopf": {"x": 1}}}) == SETTLED["infeasible"]


def test_settle_reports_every_refused_write_and_the_recovery() -> None:
    state = BY_NAME["ready"]
    world = state.world(SETTLED["ready"], T0)
    intent = desire(world, {})
    failures = [WriteFailure(WriteKind.DEPLOYMENT, "scale", 403, "403 deployments.apps is forbidden"), REFUSED]
    refused = settle(intent, world, failures)
    condition = find_condition(refused.status.conditions, "WriteFailed")
    assert condition is not None and condition.status == ConditionStatus.TRUE
    assert condition.reason == "DeploymentWriteFailed"
    assert "scale Deployment team-a/llama-70b failed: 403" in condition.message
    assert "create Service team-a/llama-70b failed: 500" in condition.message
    assert "Grant kvscale's ServiceAccount" in condition.message
    assert [e.reason for e in refused.events] == ["WriteFailed"]
    recovered = settle(intent, state.world(refused.status, T0 + timedelta(minutes=1)), [])
    assert [e.reason for e in recovered.events] == ["WritesRecovered"]


def test_replicas_stay_within_bounds_whatever_the_status_says() -> None:
    spec = parse_spec(FEASIBLE)
    _, plan = plan_cached(spec, None, {})
    assert plan.chosen is not None
    written_elsewhere = LLMDeploymentStatus(observed_generation=1, desired_replicas=99)
    live = owned_deployment(FEASIBLE, 1)
    assert decide_replicas(spec, plan.chosen, live, written_elsewhere, 1) == spec.scaling.max_replicas


def test_backoff_doubles_per_refusal_and_lets_a_different_write_through() -> None:
    backoff = Backoff()
    body_print = fingerprint({"a": 1})
    delays = []
    for attempt in range(8):
        now_s = 1000.0 * attempt
        backoff = backoff.record(WriteKind.SERVICE, body_print, REFUSED, now_s)
        delays.append(backoff.refusals[WriteKind.SERVICE].retry_at_s - now_s)
        assert backoff.waiting(WriteKind.SERVICE, body_print, now_s + 1) == REFUSED
        assert backoff.waiting(WriteKind.SERVICE, fingerprint({"a": 2}), now_s + 1) is None
        assert backoff.waiting(WriteKind.SERVICE, body_print, now_s + delays[-1]) is None
    assert delays[:3] == [BACKOFF_BASE_S, 2 * BACKOFF_BASE_S, 4 * BACKOFF_BASE_S]
    assert delays[-1] == BACKOFF_MAX_S
    assert not backoff.is_new(WriteKind.SERVICE, REFUSED)
    assert backoff.record(WriteKind.SERVICE, body_print, None, 0.0).refusals == {}


def test_a_precision_no_engine_can_load_is_an_invalid_spec_not_a_crash() -> None:
    """Found by the fuzz test: int4 for a bf16 checkpoint planned fine, then failed building the Deployment."""
    int4 = State("int4", spec_with(**{"model.precision": "int4"}), None, None)
    _, intent = run_pass(int4, None, T0)
    invalid = find_condition(intent.status.conditions, "InvalidSpec")
    assert invalid is not None and invalid.status == ConditionStatus.TRUE
    assert "int4 needs a checkpoint already quantized to int4" in invalid.message
    assert intent.writes == ()


def test_a_scale_down_marks_the_busy_pods_first_and_nothing_else_does() -> None:
    loads = {"llama-70b-abc": 7.0, "llama-70b-def": 0.0}
    ready = BY_NAME["ready"]
    assert PLANNED_REPLICAS > 1
    lowered = spec_with(**{"workload.requestsPerSecond": 1})  # the new plan starts with fewer
    # a pass on the spec edit's own event (no fresh metrics): the last resync's per-pod figures serve
    world = replace(ready.world(SETTLED["ready"], T0), body=body(lowered, SETTLED["ready"], 2),
                    in_flight_by_pod=loads)
    intent = desire(world, {})
    [write] = intent.writes
    assert write.body["spec"]["replicas"] < PLANNED_REPLICAS
    assert intent.scale_down is not None and intent.scale_down.in_flight_by_pod == loads
    assert intent.scale_down.namespace == OWNER.namespace
    assert intent.scale_down.selector == {"kvscale.dev/llmdeployment": OWNER.name}
    # no scale-down, or no per-pod figures: nothing to mark
    assert desire(replace(world, body=body(FEASIBLE, SETTLED["ready"], 1)), {}).scale_down is None
    assert desire(replace(world, in_flight_by_pod=None), {}).scale_down is None


class RecordingCluster:
    """The calls `apply_intent` makes, in order; pod annotations refused when `refuse_pods`."""

    def __init__(self, pods: list[dict[str, Any]], refuse_pods: bool = False) -> None:
        self.pods, self.refuse_pods = pods, refuse_pods
        self.calls: list[tuple[str, ...]] = []

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        self.calls.append(("list pods", namespace))
        return self.pods

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        from kvscale.kube.cluster import KubeApiError

        if self.refuse_pods:
            raise KubeApiError("annotate: 403 forbidden", 403)
        self.calls.append(("annotate", name, *annotations.values()))

    def apply(self, body: Mapping[str, Any], force: bool = False) -> dict[str, Any]:
        self.calls.append(("apply", body["kind"], str(body["spec"].get("replicas"))))
        return dict(body)

    def patch_llmdeployment_status(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("status",))
        return {"metadata": {"resourceVersion": "8"}}

    def emit_event(self, *args: Any) -> None:
        pass


def test_the_costs_are_written_before_the_deployment_loses_replicas_and_a_refusal_does_not_hold_it() -> None:
    from kvscale.controllers.apply import apply_intent

    pods = [{"metadata": {"name": n, "labels": {"kvscale.dev/llmdeployment": OWNER.name}}}
            for n in ("llama-70b-abc", "llama-70b-def")]
    world = replace(BY_NAME["ready"].world(SETTLED["ready"], T0),
                    body=body(spec_with(**{"workload.requestsPerSecond": 1}), SETTLED["ready"], 2),
                    in_flight_by_pod={"llama-70b-abc": 7.0})
    intent = desire(world, {})
    cluster = RecordingCluster(pods)
    applied = apply_intent(cluster, world, intent, Backoff())  # type: ignore[arg-type]
    assert cluster.calls[:4] == [("list pods", OWNER.namespace), ("annotate", "llama-70b-abc", "70"),
                                 ("annotate", "llama-70b-def", "0"), ("apply", "Deployment", "1")]
    assert "annotate 2 pod(s)" in applied.report.written

    refusing = RecordingCluster(pods, refuse_pods=True)
    applied = apply_intent(refusing, world, intent, Backoff())  # type: ignore[arg-type]
    assert ("apply", "Deployment", "1") in refusing.calls and not applied.report.refused

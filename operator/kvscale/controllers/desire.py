"""The decision of one reconcile pass, as a value: `desire(World) -> Intent` (pure).

Each state builds its status from scratch and carries over only what outlives a state change
(the calibration learned from metrics and the last scale decision), so a field that no longer
applies cannot linger: an Infeasible resource has no predictions or desired replicas, an invalid
one has no plan. Conditions keep their lastTransitionTime from the previous status.

`settle` folds the outcome of the writes (which only the edge knows) into the Intent.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kvscale.api.conditions import (
    ConditionType,
    Reason,
    ServingConfiguration,
    build_plan_status,
    build_predicted_status,
    find_condition,
    plan_conditions,
    set_condition,
)
from kvscale.api.spec import LLMDeploymentSpec, ScalingMode, parse_spec
from kvscale.api.status import (
    Condition,
    ConditionStatus,
    LLMDeploymentStatus,
    MovePhase,
    headline_latencies_ms,
    headline_latency_fields,
)
from kvscale.autoscaler import ScaleDecision
from kvscale.catalog import GpuSpec
from kvscale.controllers.autoscaling import autoscale, previous_calibration
from kvscale.controllers.events import EventReason
from kvscale.controllers.moving import (
    MoveContext,
    MovePlan,
    MoveStep,
    advance_move,
    leftover_deployments,
    serving_pins,
)
from kvscale.controllers.replanning import replan_due, replan_status, same_configuration
from kvscale.controllers.world import (
    Intent,
    ObjectDelete,
    ObjectWrite,
    ScaleDownPrep,
    World,
    WriteFailure,
    WriteKind,
)
from kvscale.controllers.writes import workload_write
from kvscale.errors import CatalogError, InvalidSpecError
from kvscale.kube.builders import (
    Owner,
    build_deployment,
    build_service,
    selector_labels,
    selector_string,
)
from kvscale.kube.cluster import EventRecord
from kvscale.kube.leaderworkerset import (
    build_leader_worker_set,
    leader_selector,
    leader_worker_set_name,
    multi_node_problems,
)
from kvscale.kube.state import (
    count_free_replica_slots,
    count_gpu_capacity,
    is_owned_by,
    is_subset,
    pod_startups,
    replica_counts,
)
from kvscale.planner import Candidate, Plan, build_plan_inputs, chosen_setup, plan_deployment
from kvscale.planner.replan import pinned_to
from kvscale.planner.search import PlanInputs

# The conditions each state evaluates; any other type is dropped from the status in that state.
_INVALID = frozenset({ConditionType.INVALID_SPEC, ConditionType.PLANNED, ConditionType.READY})
_INFEASIBLE = _INVALID | {ConditionType.INFEASIBLE}
_PLANNED = _INFEASIBLE | {ConditionType.INSUFFICIENT_CAPACITY}


def previous_status(body: Mapping[str, Any]) -> LLMDeploymentStatus | None:
    """The status as the last pass (or another operator version) left it; None when absent or unreadable."""
    raw = dict(body.get("status") or {})
    raw.pop("kopf", None)
    if not raw:
        return None
    try:
        return LLMDeploymentStatus.model_validate(raw)
    except ValidationError:
        return None  # rebuilt from scratch below: everything in it is derived or re-learned


def status_dict(status: LLMDeploymentStatus) -> dict[str, Any]:
    """The status as JSON, every absent field an explicit null: a merge patch removes a field only
    when it is sent as null, and a status write must clear what no longer applies."""
    return status.model_dump(by_alias=True, exclude_none=False, mode="json")


def same_status(previous: LLMDeploymentStatus | None, status: LLMDeploymentStatus) -> bool:
    return previous is not None and previous.model_dump(mode="json") == status.model_dump(mode="json")


def read_config_json(config_map: Mapping[str, Any] | None, namespace: str,
                     spec: LLMDeploymentSpec) -> dict[str, Any] | None:
    """The config.json spec.model.configMapRef points at, parsed; None when the spec names none."""
    ref = spec.model.config_map_ref
    if spec.model.config_path:
        raise InvalidSpecError("spec.model.configPath is for the offline CLI; in the cluster use "
                               "spec.model.configMapRef or spec.model.architecture")
    if ref is None:
        return None
    if config_map is None:
        raise InvalidSpecError(f"spec.model.configMapRef: ConfigMap {namespace}/{ref.name} not found")
    text = (config_map.get("data") or {}).get(ref.key)
    if text is None:
        raise InvalidSpecError(f"spec.model.configMapRef: ConfigMap {ref.name} has no key {ref.key!r}")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSpecError(f"spec.model.configMapRef: {ref.name}/{ref.key} is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise InvalidSpecError(f"spec.model.configMapRef: {ref.name}/{ref.key} is not a JSON object")
    return config


@functools.lru_cache(maxsize=2048)
def _plan_from_key(key: str) -> tuple[PlanInputs, Plan]:
    spec_json, config, prices = json.loads(key)
    inputs = build_plan_inputs(LLMDeploymentSpec.model_validate(spec_json), config,
                               default_prices_usd_per_hour=prices)
    return inputs, plan_deployment(inputs)


def plan_cached(spec: LLMDeploymentSpec, config_json: dict[str, Any] | None,
                default_prices: Mapping[str, float]) -> tuple[PlanInputs, Plan]:
    """Planning is a pure function of the spec, the architecture and the prices: each distinct input is
    planned once, so the many reconciles of an unchanged resource cost reads and compares only."""
    key = json.dumps([spec.model_dump(mode="json", by_alias=True), config_json, dict(default_prices)],
                     sort_keys=True)
    return _plan_from_key(key)


def decide_replicas(spec: LLMDeploymentSpec, chosen: Candidate, live: Mapping[str, Any] | None,
                    previous: LLMDeploymentStatus | None, generation: int) -> int:
    """Replicas the Deployment should have. A new spec (or a new Deployment) starts from the plan;
    between spec changes the count belongs to the scaling loop and is left where it is (within the
    spec's bounds, whatever the status says)."""
    if spec.scaling.mode == ScalingMode.OFF and spec.replicas is not None:
        return spec.replicas
    low, high = spec.scaling.min_replicas, spec.scaling.max_replicas
    planned = min(max(chosen.replicas, low), high)
    if live is None or previous is None or previous.observed_generation != generation:
        return planned
    kept = previous.desired_replicas
    if kept is None:
        kept = int((live.get("spec") or {}).get("replicas") or planned)
    return min(max(kept, low), high)


def _only(conditions: Sequence[Condition], types: Collection[str]) -> list[Condition]:
    """The conditions of `types`, in the catalogue's order (a stable order: no write for a reorder)."""
    by_type = {c.type: c for c in conditions}
    return [by_type[t] for t in ConditionType if t in types and t in by_type]


def condition_changed(before: LLMDeploymentStatus | None, after: LLMDeploymentStatus, type_: str) -> bool:
    old = find_condition(before.conditions, type_) if before else None
    new = find_condition(after.conditions, type_)
    if new is None:
        return False
    return old is None or (old.status, old.reason, old.message) != (new.status, new.reason, new.message)


def _flip_event(previous: LLMDeploymentStatus | None, status: LLMDeploymentStatus, type_: str,
                raised: EventReason, cleared: EventReason) -> list[EventRecord]:
    """A Warning when a problem condition turns True (or its message changes), a Normal when it clears."""
    if not condition_changed(previous, status, type_):
        return []
    condition = find_condition(status.conditions, type_)
    assert condition is not None
    if condition.status == ConditionStatus.TRUE:
        return [EventRecord("Warning", raised.value, condition.message)]
    if previous is not None and find_condition(previous.conditions, type_) is not None:
        return [EventRecord("Normal", cleared.value, condition.message)]
    return []


class _Pass:
    """The facts of one pass that every state needs."""

    def __init__(self, world: World, multi_node: bool | None = None) -> None:
        """`multi_node`: whether the replicas are LeaderWorkerSet groups (the plan's replicas span nodes) or a
        Deployment's pods; None (before a plan is known): whichever of the two kvscale owns, a Deployment first."""
        meta = world.body["metadata"]
        self.world = world
        self.now: datetime = world.now
        self.owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        self.generation = int(meta.get("generation") or 0)
        self.previous = previous_status(world.body)
        deployment, groups = (self._owned(world.deployment), self._owned(world.leader_worker_set))
        self.multi_node = (deployment is None and groups is not None) if multi_node is None else multi_node
        self.kind = WriteKind.LEADER_WORKER_SET if self.multi_node else WriteKind.DEPLOYMENT
        live = world.leader_worker_set if self.multi_node else world.deployment
        self.owned = groups if self.multi_node else deployment
        self.foreign = live is not None and self.owned is None
        self.retired = deployment if self.multi_node else groups  # kvscale's object of the kind not in use
        serving = self.previous.serving if self.previous is not None else None
        self.deployment_name = serving.deployment if serving is not None else self.owner.name
        self.workload_name = leader_worker_set_name(self.owner.name) if self.multi_node else self.deployment_name
        current, ready = replica_counts(self.owned)
        kept = self.previous or LLMDeploymentStatus()
        # What outlives any state: the live replica counts, what metrics taught, and the last decision.
        self.base = LLMDeploymentStatus(
            observed_generation=self.generation, replicas=current, ready_replicas=ready,
            selector=selector_string(self.owner), calibration=kept.calibration, startup=kept.startup,
            forecast=kept.forecast, last_scale_decision=kept.last_scale_decision, recommendation=kept.recommendation,
            serving=kept.serving, move=kept.move, last_move_at=kept.last_move_at,
            conditions=list(kept.conditions))

    def _owned(self, live: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        return live if live is not None and is_owned_by(live, self.owner.uid) else None

    def condition(self, conditions: Sequence[Condition], type_: str, status: ConditionStatus, reason: str,
                  message: str) -> list[Condition]:
        return set_condition(conditions, type_, status, reason, message, self.now, self.generation)


def desire(world: World, default_prices: Mapping[str, float]) -> Intent:
    """What the LLMDeployment's objects and status should be, from what was read. Pure."""
    run = _Pass(world)
    try:
        spec = parse_spec(dict(world.body.get("spec") or {}))
        config = read_config_json(world.config_map, run.owner.namespace, spec)
        spec_inputs, plan = plan_cached(spec, config, default_prices)
    except (InvalidSpecError, CatalogError) as exc:
        return _invalid(run, str(exc))
    inputs = spec_inputs

    def pinned_plan(pins: ServingConfiguration) -> MovePlan | None:
        """The spec with a configuration pinned, planned (the declared workload); None when infeasible."""
        pinned_inputs, pinned = plan_cached(pinned_to(spec, pins), config, default_prices)
        return None if pinned.chosen is None or not pinned.feasible else MovePlan(pinned_inputs, pinned,
                                                                                  pinned.chosen)

    pins = serving_pins(run.previous, run.generation)
    if pins is not None and (moved := pinned_plan(pins)) is not None and plan.feasible:
        inputs, plan = moved.inputs, moved.plan  # where the last move put it, until the spec changes
    if not plan.feasible or plan.chosen is None:
        return _infeasible(run, plan)
    multi_node = plan.chosen.multi_node
    if multi_node and not world.leader_worker_sets_served:
        return _multi_node(run, plan, Reason.LEADER_WORKER_SET_NOT_INSTALLED, multi_node_message(plan.chosen))
    if multi_node and (problems := multi_node_problems(run.owner.name, spec)):
        return _multi_node(run, plan, Reason.MULTI_NODE_NOT_RUNNABLE,
                           f"The plan needs {plan.chosen.nodes_per_replica} nodes per replica ({plan.chosen.layout}), "
                           f"run as a LeaderWorkerSet, and it cannot run: {'; '.join(problems)}. kvscale writes "
                           "nothing until then and leaves an existing Deployment as it is.")
    if multi_node != run.multi_node:
        run = _Pass(world, multi_node=multi_node)
    return _planned(run, spec, inputs, plan, plan.chosen, spec_inputs, pinned_plan)


def _invalid(run: _Pass, message: str) -> Intent:
    conditions = run.condition(run.base.conditions, ConditionType.INVALID_SPEC, ConditionStatus.TRUE,
                               "InvalidSpec", message)
    conditions = run.condition(conditions, ConditionType.PLANNED, ConditionStatus.FALSE, "InvalidSpec",
                               "Not planned: the spec is invalid; see the InvalidSpec condition.")
    conditions = run.condition(conditions, ConditionType.READY, ConditionStatus.FALSE, "InvalidSpec",
                               "The current spec is not served: it is invalid. An existing Deployment keeps "
                               "running the last valid plan.")
    status = run.base.model_copy(update={"conditions": _only(conditions, _INVALID)})
    events = []
    if condition_changed(run.previous, status, ConditionType.INVALID_SPEC):
        events.append(EventRecord("Warning", EventReason.INVALID_SPEC.value, f"{message}. Fix the spec and re-apply."))
    return Intent(status=status, events=tuple(events))


def _plan_conditions(run: _Pass, plan: Plan) -> list[Condition]:
    conditions = run.condition(run.base.conditions, ConditionType.INVALID_SPEC, ConditionStatus.FALSE,
                               "SpecValid", "The spec is valid.")
    return plan_conditions(plan, conditions, run.now, run.generation)


def _infeasible(run: _Pass, plan: Plan) -> Intent:
    """No configuration meets the SLOs: an existing Deployment is left as it is (the last good plan
    keeps serving), and nothing of the old plan's predictions stays in status."""
    conditions = run.condition(_plan_conditions(run, plan), ConditionType.READY, ConditionStatus.FALSE,
                               "NoFeasiblePlan", "No configuration meets the SLOs; see the Infeasible condition.")
    status = run.base.model_copy(update={"plan": build_plan_status(plan),
                                         "conditions": _only(conditions, _INFEASIBLE)})
    events = []
    if condition_changed(run.previous, status, ConditionType.INFEASIBLE):
        events.append(EventRecord("Warning", EventReason.INFEASIBLE.value,
                                  plan.explanation + " Relax the SLO, add GPU types or lower the workload."))
    return Intent(status=status, events=tuple(events))


def multi_node_message(chosen: Candidate) -> str:
    """Ready's message while the plan's replicas span nodes and the cluster has no LeaderWorkerSet API."""
    return (f"The plan needs {chosen.nodes_per_replica} nodes per replica ({chosen.layout}, {chosen.parallelism}). "
            "kvscale runs such replicas as a LeaderWorkerSet, and this cluster does not "
            "serve leaderworkersets.leaderworkerset.x-k8s.io: install LeaderWorkerSet (sigs.k8s.io/lws, v0.8.0 or "
            "later; its CRD, controller and webhooks) and kvscale creates it on its next pass. Until then it "
            "creates nothing and leaves an existing Deployment as it is. Or pin spec.serving.pipelineParallel: 1 "
            "(and dataParallel: 1) with a smaller precision (e.g. fp8) or larger GPUs in spec.gpu.types.")


def _multi_node(run: _Pass, plan: Plan, reason: Reason, message: str) -> Intent:
    """A feasible multi-node plan that cannot run here (no LeaderWorkerSet API, or a name or image LWS or the
    engine would refuse): shown in status (plan and predictions), nothing written, Ready False with `reason`,
    one Warning event when that starts or its message changes."""
    conditions = run.condition(_plan_conditions(run, plan), ConditionType.READY, ConditionStatus.FALSE,
                               reason, message)
    status = run.base.model_copy(update={"plan": build_plan_status(plan), "predicted": build_predicted_status(plan),
                                         "conditions": _only(conditions, _INFEASIBLE)})
    ready = find_condition(run.previous.conditions, ConditionType.READY) if run.previous else None
    events = []
    if ready is None or (ready.reason, ready.message) != (reason, message):
        events.append(EventRecord("Warning", EventReason(reason.value).value, message))
    return Intent(status=status, events=tuple(events))


def _gpu_of(inputs: PlanInputs, chosen: Candidate) -> GpuSpec:
    return next(g for g in inputs.gpus if g.name == chosen.gpu_type)


def _planned(run: _Pass, spec: LLMDeploymentSpec, inputs: PlanInputs, plan: Plan, chosen: Candidate,
             spec_inputs: PlanInputs, pinned_plan: Callable[[ServingConfiguration], MovePlan | None]) -> Intent:
    """`inputs`/`plan`: what the serving Deployment runs (the spec's plan, or where a move put it);
    `spec_inputs`: the spec's own, which a re-plan searches; `pinned_plan`: the spec with a configuration pinned."""
    previous, world, owner = run.previous, run.world, run.owner
    moving = previous.move if previous is not None else None
    gpu = _gpu_of(inputs, chosen)
    metrics_kept = spec.scaling.mode != ScalingMode.OFF  # Off: no metrics are fetched, none are shown
    kept = previous if previous is not None and metrics_kept else LLMDeploymentStatus()
    predicted = build_predicted_status(plan)
    ttft_ms, tpot_ms = headline_latencies_ms(kept.observed, predicted)
    replicas = decide_replicas(spec, chosen, run.owned, previous, run.generation)
    status = run.base.model_copy(update={
        "plan": build_plan_status(plan), "predicted": predicted, "observed": kept.observed,
        "slo_met": kept.slo_met, **headline_latency_fields(ttft_ms, tpot_ms),
        "conditions": _plan_conditions(run, plan)})
    events: list[EventRecord] = []
    decision, scale_reason = None, None
    settled = run.owned is not None and previous is not None and previous.observed_generation == run.generation
    serving = leader_selector(owner) if run.multi_node else selector_labels(owner)  # the pods that serve
    # While the old Deployment drains nothing is scaled: the new one holds what the demand needed at the switch.
    if world.scaling is not None and metrics_kept and settled and (moving is None
                                                                  or moving.phase == MovePhase.STARTING):
        pods = world.scaling.bound_pods
        # a replica is a whole group: nodes_per_replica pods of gpus_per_pod GPUs each
        free = None if pods is None else (count_free_replica_slots(world.nodes, pods, gpu, chosen.gpus_per_pod)
                                          // chosen.nodes_per_replica)
        startups = [] if pods is None else pod_startups(pods, owner.namespace, serving)
        result = autoscale(spec, chosen_setup(inputs, chosen), chosen, status, previous, replicas,
                           status.ready_replicas, free, world.scaling, run.now, startups)
        status, replicas, decision = result.status, result.replicas, result.decision
        scale_reason = decision.reason
        events += _flip_event(previous, status, ConditionType.METRICS_UNAVAILABLE,
                              EventReason.METRICS_UNAVAILABLE, EventReason.METRICS_AVAILABLE)
        recommended = status.last_scale_decision
        if spec.scaling.mode == ScalingMode.RECOMMEND and recommended is not None and (
                previous is None or previous.last_scale_decision != recommended):
            events.append(EventRecord("Normal", EventReason.SCALE_RECOMMENDED.value, recommended.reason))
        if moving is None:  # a move under way is not second-guessed
            status, replan_events = _replanned(spec, spec_inputs, chosen, status, world.scaling.history.forecasts.day,
                                               run.now)
            events += replan_events
    evaluated = _PLANNED | ({ConditionType.METRICS_UNAVAILABLE} if metrics_kept else set())
    if previous is None or previous.plan != status.plan:
        events.append(EventRecord("Normal", EventReason.PLANNED.value, plan.explanation))
    if run.foreign:
        return _name_conflict(run, status, evaluated - {ConditionType.INSUFFICIENT_CAPACITY}, replicas, events,
                              decision)
    step = _move_step(run, spec, spec_inputs, chosen, status, replicas, decision, pinned_plan)
    status, active_replicas = step.status, step.active_replicas
    desired_replicas = replicas if active_replicas is not None else (status.desired_replicas or 0)
    writes: list[ObjectWrite | None] = []
    if active_replicas is not None:  # None: the drained Deployment is deleted in this pass
        if run.multi_node:
            desired = build_leader_worker_set(owner, spec, chosen, active_replicas, gpu=gpu,
                                              native_precision=inputs.arch.native_precision)
        else:
            identity = previous.serving if previous is not None else None
            desired = build_deployment(owner, spec, chosen, active_replicas, gpu=gpu,
                                       native_precision=inputs.arch.native_precision, name=run.deployment_name,
                                       configuration_label=identity.label if identity is not None else None)
        writes.append(workload_write(run.kind, desired, run.owned, active_replicas, scale_reason))
    writes += [*step.writes, _service_write(owner, build_service(owner, spec, serving), world.service)]
    in_move = status.move.replicas if status.move is not None else 0
    conditions = _capacity_and_ready(run, status.conditions, gpu, chosen,
                                     (active_replicas if active_replicas is not None else desired_replicas) + in_move,
                                     status.ready_replicas)
    status = status.model_copy(update={"desired_replicas": desired_replicas,
                                       "conditions": _only(conditions, evaluated)})
    events += [*_flip_event(previous, status, ConditionType.INSUFFICIENT_CAPACITY,
                            EventReason.INSUFFICIENT_CAPACITY, EventReason.CAPACITY_AVAILABLE), *step.events]
    quiet = status.move is None and moving is None
    scale_down = None if run.multi_node or not quiet else _scale_down_prep(owner, run.owned, replicas, world)
    ready = run.owned is not None and status.ready_replicas >= max(desired_replicas, 1)
    leftovers = leftover_deployments(owner, world.labelled_deployments, (run.deployment_name,),
                                     settled=quiet and ready)
    return Intent(status=status, writes=tuple(w for w in writes if w is not None), events=tuple(events),
                  decision=decision, tracks_writes=True, scale_down=scale_down,
                  deletes=(*_retire(run, chosen), *step.deletes, *leftovers))


def _move_step(run: _Pass, spec: LLMDeploymentSpec, spec_inputs: PlanInputs, chosen: Candidate,
               status: LLMDeploymentStatus, replicas: int, decision: ScaleDecision | None,
               pinned_plan: Callable[[ServingConfiguration], MovePlan | None]) -> MoveStep:
    """Where a move to a re-planned configuration goes in this pass (controllers.moving)."""
    world = run.world
    move, rec = status.move, status.recommendation
    target: ServingConfiguration | None = move.to if move is not None else (
        rec.proposed if rec is not None and rec.recommended else None)
    pods = world.scaling.bound_pods if world.scaling is not None else None

    def free_slots(gpu_type: str, gpus_per_pod: int) -> int | None:
        gpu = next((g for g in spec_inputs.gpus if g.name == gpu_type), None)
        if pods is None or gpu is None:
            return None
        return count_free_replica_slots(world.nodes, pods, gpu, gpus_per_pod)

    return advance_move(MoveContext(
        spec=spec, owner=run.owner, generation=run.generation, now=run.now, status=status, running=chosen,
        serving_name=run.deployment_name, active=run.owned, target=world.move_target, replicas=replicas,
        decision=decision, multi_node=run.multi_node, plan=None if target is None else pinned_plan(target),
        free_replica_slots=free_slots,
        blocked_before=run.previous.recommendation.move_blocked
        if run.previous is not None and run.previous.recommendation is not None else None))


def _replanned(spec: LLMDeploymentSpec, inputs: PlanInputs, chosen: Candidate, status: LLMDeploymentStatus,
               minute_rates_per_s: Sequence[float], now: datetime) -> tuple[LLMDeploymentStatus, list[EventRecord]]:
    """Re-plan on the served traffic when due (status.recommendation); one event when a proposal becomes
    recommended or the recommended one changes."""
    before = status.recommendation
    calibration = previous_calibration(status)
    if not replan_due(spec, before, calibration, len(minute_rates_per_s), now):
        return status, []
    after = replan_status(inputs, chosen, calibration, minute_rates_per_s, before, now)
    events = []
    if after.recommended and after.proposed is not None and (
            before is None or not before.recommended or not same_configuration(before.proposed, after.proposed)):
        events.append(EventRecord("Normal", EventReason.REPLAN_RECOMMENDED.value, after.reason))
    return status.model_copy(update={"recommendation": after}), events


def _retire(run: _Pass, chosen: Candidate) -> tuple[ObjectDelete, ...]:
    """When the plan moved between one node and several per replica, kvscale's object of the old kind goes
    (after the new one is written): no orphan keeps its GPUs."""
    old = run.retired
    if old is None:
        return ()
    kind = WriteKind.DEPLOYMENT if run.multi_node else WriteKind.LEADER_WORKER_SET
    why = (f"replicas now span {chosen.nodes_per_replica} nodes ({chosen.layout})" if run.multi_node
           else f"a replica now fits one node ({chosen.layout})")
    name = str(old["metadata"]["name"])
    event = EventRecord("Normal", EventReason.WORKLOAD_REPLACED.value,
                        f"Deleted {kind} {name}: the plan's {why}, so {run.kind} {run.workload_name} serves instead.")
    return (ObjectDelete(kind, name, str(old["metadata"]["uid"]), (event,)),)


def _scale_down_prep(owner: Owner, live: Mapping[str, Any] | None, replicas: int, world: World) -> ScaleDownPrep | None:
    """When the Deployment is about to lose replicas and per-pod load is known: which pods are busy."""
    loads = world.in_flight_by_pod
    if live is None or loads is None or replicas >= int((live.get("spec") or {}).get("replicas") or 0):
        return None
    return ScaleDownPrep(owner.namespace, selector_labels(owner), loads)


def _name_conflict(run: _Pass, status: LLMDeploymentStatus, evaluated: Collection[str], replicas: int,
                   events: list[EventRecord], decision: ScaleDecision | None) -> Intent:
    owner = run.owner
    message = (f"{run.kind} {owner.namespace}/{run.workload_name} exists and is not owned by this LLMDeployment; "
               f"kvscale leaves it alone. Rename the LLMDeployment or remove that {run.kind}.")
    ready = find_condition(run.previous.conditions, ConditionType.READY) if run.previous else None
    if ready is None or ready.reason != "NameConflict":
        events.append(EventRecord("Warning", EventReason.NAME_CONFLICT.value, message))
    conditions = run.condition(status.conditions, ConditionType.READY, ConditionStatus.FALSE, "NameConflict", message)
    status = status.model_copy(update={"desired_replicas": replicas, "conditions": _only(conditions, evaluated)})
    return Intent(status=status, events=tuple(events), decision=decision)


def _capacity_and_ready(run: _Pass, conditions: Sequence[Condition], gpu: GpuSpec, chosen: Candidate,
                        replicas: int, ready: int) -> list[Condition]:
    tp, pp = chosen.gpus_per_pod, chosen.nodes_per_replica  # GPUs per pod, pods (nodes) per replica
    capacity = count_gpu_capacity(run.world.nodes, gpu, tp)
    fits = capacity.replica_slots // pp  # a replica needs pp pods of tp GPUs, each on a node with room for it
    shape = chosen.parallelism if pp == 1 else f"{pp} pods of {tp} GPUs ({chosen.parallelism})"
    if fits < replicas:
        per_replica = f"{tp} per node" if pp == 1 else f"{pp} nodes x {tp} per replica"
        conditions = run.condition(
            conditions, ConditionType.INSUFFICIENT_CAPACITY, ConditionStatus.TRUE, "NotEnoughGpus",
            f"The plan needs {replicas} x {pp * tp} {gpu.name} ({replicas * pp * tp} GPUs, {per_replica}); the "
            f"cluster's Ready nodes labelled {gpu.product_label} have {capacity.gpus} allocatable on "
            f"{capacity.nodes} node(s), room for {fits} replica(s). Add nodes or lower maxReplicas / the workload.")
    else:
        conditions = run.condition(
            conditions, ConditionType.INSUFFICIENT_CAPACITY, ConditionStatus.FALSE, "EnoughGpus",
            f"{capacity.gpus} allocatable {gpu.name} GPUs hold {fits} replica(s) of {shape}; the plan needs "
            f"{replicas}.")
    if ready >= replicas and replicas > 0:
        return run.condition(conditions, ConditionType.READY, ConditionStatus.TRUE, "ReplicasReady",
                             f"{ready}/{replicas} replicas ready.")
    return run.condition(conditions, ConditionType.READY, ConditionStatus.FALSE, "ReplicasNotReady",
                         f"{ready}/{replicas} replicas ready.")


def _service_write(owner: Owner, desired: dict[str, Any], live: Mapping[str, Any] | None) -> ObjectWrite | None:
    if live is None:
        return ObjectWrite(WriteKind.SERVICE, "create", desired, (EventRecord(
            "Normal", EventReason.SERVICE_CREATED.value, f"Created Service {owner.name}:8000."),))
    if not is_owned_by(live, owner.uid):
        return None  # someone else's Service of that name: never touched
    live_spec = live.get("spec") or {}
    selector = dict(live_spec.get("selector") or {})
    # The selector must match exactly (an extra key selects fewer pods: a Deployment's pods lack the leader label).
    if (desired["spec"]["selector"] == selector
            and is_subset(desired["spec"]["ports"], live_spec.get("ports", []))
            and is_subset(desired["metadata"]["labels"], (live.get("metadata") or {}).get("labels", {}))):
        return None
    wanted = desired["spec"]["selector"]
    if selector != wanted and selector in (selector_labels(owner), leader_selector(owner)):  # the other kind's
        pods = ",".join(f"{key}={value}" for key, value in sorted(wanted.items()))
        return ObjectWrite(WriteKind.SERVICE, "update", desired, (EventRecord(
            "Normal", EventReason.WORKLOAD_REPLACED.value, f"Service {owner.name} now selects {pods}."),))
    return ObjectWrite(WriteKind.SERVICE, "update", desired, (EventRecord(
        "Warning", EventReason.DRIFT_CORRECTED.value,
        f"Service {owner.name} was edited outside kvscale; its selector and ports were put back."),))


# --- after the writes ----------------------------------------------------------------------------

def fix_hint(failure: WriteFailure) -> str:
    """What a person can do about a refused write, by the API server's answer."""
    code, text = failure.status_code, failure.message.lower()
    if code == 403 and "quota" in text:
        return "Raise the namespace's ResourceQuota or lower maxReplicas."
    if code in (401, 403):
        return (f"Grant kvscale's ServiceAccount create/patch on {failure.kind}s in this namespace "
                "(the Helm chart's ClusterRole does).")
    if code in (400, 422):
        return ("The API server rejected the object built from the spec: check spec.serving (image, extraArgs, "
                "env, resources, nodeSelector, tolerations).")
    if code == 404:
        return "The namespace or API is gone; kvscale retries with back-off."
    return ("The API server could not complete the write (see its message: a full Service IP range, an "
            "admission webhook, etcd); kvscale retries with back-off.")


def settle(intent: Intent, world: World, failures: Sequence[WriteFailure]) -> Intent:
    """The Intent with the WriteFailed condition (and its Event) for the writes that were refused."""
    if not intent.tracks_writes:
        return intent
    run = _Pass(world)
    refused = [f for f in failures if f.kind != WriteKind.STATUS]
    if refused:
        first = refused[0]
        message = "; ".join(f"{f.action} {f.kind} {run.owner.namespace}/{run.owner.name} failed: {f.message}"
                            for f in refused) + ". " + fix_hint(first)
        found = run.condition(run.base.conditions, ConditionType.WRITE_FAILED, ConditionStatus.TRUE,
                              f"{first.kind}WriteFailed", message)
    else:
        found = run.condition(run.base.conditions, ConditionType.WRITE_FAILED, ConditionStatus.FALSE,
                              "WritesSucceeded", "The owned Deployment and Service match the plan.")
    condition = find_condition(found, ConditionType.WRITE_FAILED)
    assert condition is not None
    types = {c.type for c in intent.status.conditions} | {ConditionType.WRITE_FAILED}
    status = intent.status.model_copy(update={"conditions": _only([*intent.status.conditions, condition], types)})
    events = _flip_event(run.previous, status, ConditionType.WRITE_FAILED, EventReason.WRITE_FAILED,
                         EventReason.WRITES_RECOVERED)
    return Intent(status=status, writes=intent.writes, events=(*intent.events, *events), decision=intent.decision,
                  deletes=intent.deletes,
                  tracks_writes=True)

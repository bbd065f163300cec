"""One reconcile of one LLMDeployment, by level: read the world, compute what it should be, write the
difference, and say why. Idempotent: an unchanged resource in an unchanged cluster writes nothing.

The clock (`now`) and the cluster (`Cluster`) are passed in; planning and building are pure.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kvscale.api.conditions import (
    ConditionType,
    build_status_from_plan,
    find_condition,
    set_condition,
)
from kvscale.api.spec import LLMDeploymentSpec, ScalingMode, parse_spec
from kvscale.api.status import ConditionStatus, LLMDeploymentStatus
from kvscale.autoscaler import ScaleDecision
from kvscale.catalog import GpuSpec
from kvscale.controllers.autoscaling import ScalingInput, autoscale
from kvscale.controllers.events import EventReason
from kvscale.errors import CatalogError, InvalidSpecError, KvscaleError
from kvscale.kube.builders import SPEC_HASH_ANNOTATION, Owner, build_deployment, build_service, selector_string
from kvscale.kube.cluster import Cluster, EventRecord
from kvscale.kube.state import (
    count_free_replica_slots,
    count_gpu_capacity,
    is_owned_by,
    is_subset,
    replica_counts,
    template_drifted,
)
from kvscale.planner import Candidate, Plan, build_plan_inputs, chosen_setup, plan_deployment
from kvscale.planner.search import PlanInputs

log = logging.getLogger("kvscale.reconcile")


@dataclass
class Outcome:
    """What one reconcile did (for logs and tests)."""

    writes: list[str] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    status: LLMDeploymentStatus | None = None  # the status as reconciled
    decision: ScaleDecision | None = None  # the autoscaler's answer, when this pass scaled


@dataclass(frozen=True)
class _Pass:
    """One reconcile pass: the object as read, the time it started, and what it has done so far."""

    body: Mapping[str, Any]
    now: datetime
    outcome: Outcome
    scaling: ScalingInput | None = None


def _previous_status(body: Mapping[str, Any]) -> LLMDeploymentStatus | None:
    raw = dict(body.get("status") or {})
    raw.pop("kopf", None)
    if not raw:
        return None
    try:
        return LLMDeploymentStatus.model_validate(raw)
    except ValidationError:
        log.warning("ignoring unreadable status of %s", body.get("metadata", {}).get("name"))
        return None


def _status_dict(status: LLMDeploymentStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def _condition_changed(before: LLMDeploymentStatus | None, after: LLMDeploymentStatus, type_: str) -> bool:
    old = find_condition(before.conditions, type_) if before else None
    new = find_condition(after.conditions, type_)
    if new is None:
        return False
    return old is None or (old.status, old.reason, old.message) != (new.status, new.reason, new.message)


def _read_config_json(cluster: Cluster, namespace: str, spec: LLMDeploymentSpec) -> dict[str, Any] | None:
    ref = spec.model.config_map_ref
    if spec.model.config_path:
        raise InvalidSpecError("spec.model.configPath is for the offline CLI; in the cluster use "
                               "spec.model.configMapRef or spec.model.architecture")
    if ref is None:
        return None
    config_map = cluster.get_config_map(namespace, ref.name)
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


def decide_replicas(spec: LLMDeploymentSpec, chosen: Candidate, live: Mapping[str, Any] | None,
                    previous: LLMDeploymentStatus | None, generation: int) -> int:
    """Replicas the Deployment should have. A new spec (or a new Deployment) starts from the plan;
    between spec changes the count belongs to the scaling loop and is left where it is."""
    if spec.scaling.mode == ScalingMode.OFF and spec.replicas is not None:
        return spec.replicas
    planned = min(max(chosen.replicas, spec.scaling.min_replicas), spec.scaling.max_replicas)
    if live is None or previous is None or previous.observed_generation != generation:
        return planned
    if previous.desired_replicas is not None:
        return previous.desired_replicas
    return int((live.get("spec") or {}).get("replicas") or planned)


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


def _gpu_of(inputs: PlanInputs, chosen: Candidate) -> GpuSpec:
    return next(g for g in inputs.gpus if g.name == chosen.gpu_type)


class Reconciler:
    """Reconciles LLMDeployments against one cluster."""

    def __init__(self, cluster: Cluster, default_prices_usd_per_hour: Mapping[str, float] | None = None) -> None:
        self.cluster = cluster
        self.default_prices = dict(default_prices_usd_per_hour or {})

    def reconcile(self, body: Mapping[str, Any], now: datetime, scaling: ScalingInput | None = None) -> Outcome:
        """Bring one resource in line. `scaling` (fresh metrics, once per resync cycle) lets the
        autoscaler act; without it replicas stay where the last decision put them."""
        run = _Pass(body=body, now=now, outcome=Outcome(), scaling=scaling)
        meta = body["metadata"]
        owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        generation = int(meta.get("generation") or 0)
        previous = _previous_status(body)
        try:
            spec = parse_spec(dict(body.get("spec") or {}))
            inputs, plan = plan_cached(spec, _read_config_json(self.cluster, owner.namespace, spec),
                                       self.default_prices)
        except (InvalidSpecError, CatalogError) as exc:
            status = self._invalid_status(previous, str(exc), now, generation)
            if _condition_changed(previous, status, ConditionType.INVALID_SPEC):
                self._event(run, "Warning", EventReason.INVALID_SPEC, f"{exc}. Fix the spec and re-apply.")
            self._write_status(run, previous, status)
            return run.outcome

        status = build_status_from_plan(plan, generation, now, previous)
        status = status.model_copy(update={"conditions": set_condition(
            status.conditions, ConditionType.INVALID_SPEC, ConditionStatus.FALSE, "SpecValid",
            "The spec is valid.", now, generation)})
        if plan.feasible and plan.chosen is not None:
            status = self._apply_plan(run, owner, spec, inputs, plan.chosen, previous, status)
        else:
            status = self._without_plan(owner, status, now, generation)
        self._plan_events(run, previous, status, plan)
        self._write_status(run, previous, status)
        return run.outcome

    # --- the plan is feasible: Deployment, Service, capacity, readiness -------------------------
    def _apply_plan(self, run: _Pass, owner: Owner, spec: LLMDeploymentSpec, inputs: PlanInputs,
                    chosen: Candidate, previous: LLMDeploymentStatus | None,
                    status: LLMDeploymentStatus) -> LLMDeploymentStatus:
        generation = status.observed_generation or 0
        now = run.now
        gpu = _gpu_of(inputs, chosen)
        live = self.cluster.get_deployment(owner.namespace, owner.name)
        replicas = decide_replicas(spec, chosen, live, previous, generation)
        nodes = self.cluster.list_nodes()
        scale_reason = None
        settled = live is not None and previous is not None and previous.observed_generation == generation
        if run.scaling is not None and spec.scaling.mode != ScalingMode.OFF and settled:
            pods = run.scaling.bound_pods
            free = None if pods is None else count_free_replica_slots(nodes, pods, gpu, chosen.tensor_parallel)
            result = autoscale(spec, chosen_setup(inputs, chosen), chosen, status, previous, replicas,
                               replica_counts(live)[1], free, run.scaling, now)
            status, replicas = result.status, result.replicas
            run.outcome.decision = result.decision
            scale_reason = result.decision.reason
            self._scaling_events(run, previous, status)
        desired = build_deployment(owner, spec, chosen, replicas, gpu=gpu,
                                   native_precision=inputs.arch.native_precision)
        conflict = live is not None and not is_owned_by(live, owner.uid)
        if conflict:
            message = (f"Deployment {owner.namespace}/{owner.name} exists and is not owned by this LLMDeployment; "
                       "kvscale leaves it alone. Rename the LLMDeployment or remove that Deployment.")
            if not previous or _ready_reason(previous) != "NameConflict":
                self._event(run, "Warning", EventReason.NAME_CONFLICT, message)
            conditions = set_condition(status.conditions, ConditionType.READY, ConditionStatus.FALSE,
                                       "NameConflict", message, now, generation)
            return status.model_copy(update={"conditions": conditions})

        live = self._apply_deployment(run, owner, desired, live, replicas, scale_reason)
        self._apply_service(run, owner, spec)
        capacity = count_gpu_capacity(nodes, gpu, chosen.tensor_parallel)
        current, ready = replica_counts(live)
        conditions = status.conditions
        if capacity.replica_slots < replicas:
            conditions = set_condition(
                conditions, ConditionType.INSUFFICIENT_CAPACITY, ConditionStatus.TRUE, "NotEnoughGpus",
                f"The plan needs {replicas} x {chosen.tensor_parallel} {gpu.name} ({replicas * chosen.tensor_parallel} "
                f"GPUs, {chosen.tensor_parallel} per node); the cluster's Ready nodes labelled {gpu.product_label} "
                f"have {capacity.gpus} allocatable on {capacity.nodes} node(s), room for {capacity.replica_slots} "
                "replica(s). Add nodes or lower maxReplicas / the workload.", now, generation)
        else:
            conditions = set_condition(
                conditions, ConditionType.INSUFFICIENT_CAPACITY, ConditionStatus.FALSE, "EnoughGpus",
                f"{capacity.gpus} allocatable {gpu.name} GPUs hold {capacity.replica_slots} replica(s) of "
                f"TP{chosen.tensor_parallel}; the plan needs {replicas}.", now, generation)
        if ready >= replicas and replicas > 0:
            conditions = set_condition(conditions, ConditionType.READY, ConditionStatus.TRUE, "ReplicasReady",
                                       f"{ready}/{replicas} replicas ready.", now, generation)
        else:
            conditions = set_condition(conditions, ConditionType.READY, ConditionStatus.FALSE, "ReplicasNotReady",
                                       f"{ready}/{replicas} replicas ready.", now, generation)
        return status.model_copy(update={
            "desired_replicas": replicas,
            "replicas": current,
            "ready_replicas": ready,
            "selector": selector_string(owner),
            "conditions": conditions,
        })

    def _apply_deployment(self, run: _Pass, owner: Owner, desired: dict[str, Any],
                          live: dict[str, Any] | None, replicas: int, scale_reason: str | None) -> dict[str, Any]:
        outcome = run.outcome
        if live is None:
            created = self.cluster.create(desired)
            outcome.writes.append("create Deployment")
            self._event(run, "Normal", EventReason.DEPLOYMENT_CREATED,
                        f"Created Deployment {owner.name} with {replicas} replica(s): "
                        + " ".join(desired["spec"]["template"]["spec"]["containers"][0]["args"]))
            return created
        patch: dict[str, Any] = {}
        live_hash = _template_hash(live)
        desired_hash = _template_hash(desired)
        if template_drifted(desired, live):
            patch = {"metadata": {"labels": desired["metadata"]["labels"],
                                  "ownerReferences": desired["metadata"]["ownerReferences"]},
                     "spec": {"template": desired["spec"]["template"], "selector": desired["spec"]["selector"],
                              "strategy": desired["spec"]["strategy"]}}
            if live_hash == desired_hash:
                self._event(run, "Warning", EventReason.DRIFT_CORRECTED,
                            f"Deployment {owner.name} was edited outside kvscale; its pod template was put back. "
                            "Change the LLMDeployment instead.")
            else:
                self._event(run, "Normal", EventReason.DEPLOYMENT_UPDATED,
                            f"Rolling Deployment {owner.name} to the new plan: "
                            + " ".join(desired["spec"]["template"]["spec"]["containers"][0]["args"]))
        if int((live.get("spec") or {}).get("replicas") or 0) != replicas:
            patch.setdefault("spec", {})["replicas"] = replicas
            self._event(run, "Normal", EventReason.SCALED,
                        scale_reason or f"Replicas {live.get('spec', {}).get('replicas')} -> {replicas}.")
        if not patch:
            return live
        outcome.writes.append("patch Deployment")
        return self.cluster.merge_patch("Deployment", owner.namespace, owner.name, patch)

    def _apply_service(self, run: _Pass, owner: Owner, spec: LLMDeploymentSpec) -> None:
        desired = build_service(owner, spec)
        live = self.cluster.get_service(owner.namespace, owner.name)
        if live is None:
            self.cluster.create(desired)
            run.outcome.writes.append("create Service")
            self._event(run, "Normal", EventReason.SERVICE_CREATED, f"Created Service {owner.name}:8000.")
            return
        if not is_owned_by(live, owner.uid):
            return  # someone else's Service of that name: never touched
        if not (is_subset(desired["spec"]["selector"], live["spec"].get("selector", {}))
                and is_subset(desired["spec"]["ports"], live["spec"].get("ports", []))):
            self.cluster.merge_patch("Service", owner.namespace, owner.name,
                                     {"spec": {"selector": desired["spec"]["selector"],
                                               "ports": desired["spec"]["ports"]}})
            run.outcome.writes.append("patch Service")

    def _scaling_events(self, run: _Pass, previous: LLMDeploymentStatus | None, status: LLMDeploymentStatus) -> None:
        self._flip_event(run, previous, status, ConditionType.METRICS_UNAVAILABLE,
                         EventReason.METRICS_UNAVAILABLE, EventReason.METRICS_AVAILABLE)
        spec_mode = (run.body.get("spec") or {}).get("scaling", {}).get("mode", ScalingMode.AUTO.value)
        decision = status.last_scale_decision
        if spec_mode == ScalingMode.RECOMMEND.value and decision is not None and (
                previous is None or previous.last_scale_decision != decision):
            self._event(run, "Normal", EventReason.SCALE_RECOMMENDED, decision.reason)

    # --- no plan ---------------------------------------------------------------------------------
    def _without_plan(self, owner: Owner, status: LLMDeploymentStatus, now: datetime,
                      generation: int) -> LLMDeploymentStatus:
        """An infeasible plan leaves any existing Deployment as it is: the last good plan keeps serving."""
        live = self.cluster.get_deployment(owner.namespace, owner.name)
        current, ready = replica_counts(live) if live and is_owned_by(live, owner.uid) else (0, 0)
        conditions = set_condition(status.conditions, ConditionType.READY, ConditionStatus.FALSE, "NoFeasiblePlan",
                                   "No configuration meets the SLOs; see the Infeasible condition.", now, generation)
        return status.model_copy(update={"replicas": current, "ready_replicas": ready,
                                         "selector": selector_string(owner), "conditions": conditions})

    def _invalid_status(self, previous: LLMDeploymentStatus | None, message: str, now: datetime,
                        generation: int) -> LLMDeploymentStatus:
        base = previous or LLMDeploymentStatus()
        conditions = set_condition(base.conditions, ConditionType.INVALID_SPEC, ConditionStatus.TRUE, "InvalidSpec",
                                   message, now, generation)
        conditions = set_condition(conditions, ConditionType.PLANNED, ConditionStatus.FALSE, "InvalidSpec",
                                   "Not planned: the spec is invalid; see the InvalidSpec condition.", now, generation)
        return base.model_copy(update={"observed_generation": generation, "conditions": conditions})

    # --- events and status -----------------------------------------------------------------------
    def _plan_events(self, run: _Pass, previous: LLMDeploymentStatus | None, status: LLMDeploymentStatus,
                     plan: Plan) -> None:
        if plan.feasible:
            if previous is None or previous.plan != status.plan:
                self._event(run, "Normal", EventReason.PLANNED, plan.explanation)
        elif _condition_changed(previous, status, ConditionType.INFEASIBLE):
            self._event(run, "Warning", EventReason.INFEASIBLE,
                        plan.explanation + " Relax the SLO, add GPU types or lower the workload.")
        self._flip_event(run, previous, status, ConditionType.INSUFFICIENT_CAPACITY,
                         EventReason.INSUFFICIENT_CAPACITY, EventReason.CAPACITY_AVAILABLE)

    def _flip_event(self, run: _Pass, previous: LLMDeploymentStatus | None, status: LLMDeploymentStatus,
                    type_: str, raised: EventReason, cleared: EventReason) -> None:
        """A Warning when a problem condition turns True (or its message changes), a Normal when it clears."""
        if not _condition_changed(previous, status, type_):
            return
        condition = find_condition(status.conditions, type_)
        if condition is None:
            return
        if condition.status == ConditionStatus.TRUE:
            self._event(run, "Warning", raised, condition.message)
        elif previous is not None and find_condition(previous.conditions, type_) is not None:
            self._event(run, "Normal", cleared, condition.message)

    def _event(self, run: _Pass, type_: str, reason: EventReason, message: str) -> None:
        record = EventRecord(type=type_, reason=reason.value, message=message)
        run.outcome.events.append(record)
        try:
            self.cluster.emit_event(run.body, record, run.now)
        except KvscaleError as exc:  # an Event is best effort; the status carries the same facts
            log.warning("could not emit event %s: %s", reason, exc)

    def _write_status(self, run: _Pass, previous: LLMDeploymentStatus | None, status: LLMDeploymentStatus) -> None:
        run.outcome.status = status
        if previous is not None and _status_dict(previous) == _status_dict(status):
            return
        meta = run.body["metadata"]
        self.cluster.patch_llmdeployment_status(meta["namespace"], meta["name"], _status_dict(status))
        run.outcome.writes.append("patch status")


def _ready_reason(status: LLMDeploymentStatus) -> str | None:
    condition = find_condition(status.conditions, ConditionType.READY)
    return condition.reason if condition else None


def _template_hash(deployment: Mapping[str, Any]) -> str | None:
    template = (deployment.get("spec") or {}).get("template") or {}
    value = ((template.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    return str(value) if value is not None else None

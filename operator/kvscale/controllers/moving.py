"""Moving to a re-planned configuration (spec.scaling.replan: Auto), one reconcile pass at a time (pure).

    none     --(recommended, room for both fleets, the move interval passed)-->  Starting
    Starting --(every replica of the new Deployment Ready)-->                      Draining
    Draining --(the old Deployment has no pod left)-->                             done (status.serving)
    Starting --(not Ready in replanMoveTimeoutSeconds, a spec edit, no longer plannable)--> rolled back

Starting: a second Deployment runs the new configuration beside the serving one, sized for the demand
the autoscaler computed (in replicas of the new configuration, raised if the demand grows); the serving
one keeps its replicas (never fewer) and is still scaled up by the autoscaler. Both carry the resource's
owner label, which the Service selects, so new pods take requests as they become Ready. Draining: the old
Deployment is scaled to 0; its pods leave the Service as they terminate and their preStop hook lets the
requests in flight finish. Then it is deleted, and status.serving names the new Deployment and the
configuration it runs (kept until a spec edit, after which kvscale plans from the spec again). Every step
lives in status.move, so a restarted operator resumes the move where it was.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kvscale.api.conditions import ServingConfiguration, format_time
from kvscale.api.spec import LLMDeploymentSpec, ReplanMode
from kvscale.api.status import (
    LLMDeploymentStatus,
    MovePhase,
    MoveStatus,
    RecommendationStatus,
    ServingConfigurationStatus,
)
from kvscale.autoscaler import ScaleDecision
from kvscale.controllers.events import EventReason
from kvscale.controllers.world import ObjectDelete, ObjectWrite, WriteKind
from kvscale.controllers.writes import workload_write
from kvscale.kube.builders import CONFIGURATION_LABEL, Owner, build_deployment
from kvscale.kube.cluster import EventRecord
from kvscale.kube.state import is_owned_by, replica_counts
from kvscale.planner import Candidate, Plan, PlanInputs
from kvscale.planner.plan import serving_flags


def configuration_label(config: ServingConfiguration, generation: int) -> str:
    """A short, stable name for a configuration chosen under one spec generation: the suffix of its
    Deployment and the value of its label. With the generation in it, a move after a spec edit never
    lands on the name of the Deployment that serves (which kept its name and now runs the spec's plan)."""
    return hashlib.sha256(json.dumps([*serving_flags(config), generation]).encode()).hexdigest()[:10]


def serving_pins(status: LLMDeploymentStatus | None, generation: int) -> ServingConfigurationStatus | None:
    """The configuration a completed move put in force, while the spec it was chosen under is current."""
    serving = status.serving if status is not None else None
    return serving if serving is not None and serving.generation == generation else None


@dataclass(frozen=True)
class MovePlan:
    """A configuration to move to (or being moved to), planned on the spec with it pinned."""

    inputs: PlanInputs
    plan: Plan
    chosen: Candidate


@dataclass(frozen=True)
class MoveContext:
    """What one pass knows that a move needs."""

    spec: LLMDeploymentSpec
    owner: Owner
    generation: int
    now: datetime
    status: LLMDeploymentStatus  # after this pass's autoscaling and re-plan
    running: Candidate  # the configuration the serving Deployment runs
    serving_name: str  # its name
    active: Mapping[str, Any] | None  # the serving Deployment, when kvscale owns it
    target: Mapping[str, Any] | None  # the Deployment status.move names, owned or not
    replicas: int  # what the autoscaler wants of the serving Deployment
    decision: ScaleDecision | None  # this pass's decision (None: no fresh metrics in this pass)
    multi_node: bool
    # the configuration to move to: status.move's when one is under way, else the recommended one; None when
    # the spec with it pinned has no feasible plan
    plan: MovePlan | None
    free_replica_slots: Callable[[str, int], int | None]  # (GPU type, GPUs per pod) -> replicas that fit; None: unknown
    blocked_before: str | None = None  # why the last pass did not move (its Event is not repeated)


@dataclass(frozen=True)
class MoveStep:
    """What the move makes of this pass."""

    status: LLMDeploymentStatus
    active_replicas: int | None  # the serving Deployment's replicas; None: it is deleted in this pass
    writes: tuple[ObjectWrite, ...] = ()
    deletes: tuple[ObjectDelete, ...] = ()
    events: tuple[EventRecord, ...] = ()


def advance_move(ctx: MoveContext) -> MoveStep:
    move = ctx.status.move
    if move is None:
        return _maybe_start(ctx)
    if move.phase == MovePhase.STARTING:
        return _starting(ctx, move)
    return _draining(ctx, move)


def _new_replicas(ctx: MoveContext, plan: MovePlan, rec: RecommendationStatus | None) -> int:
    """The demand the autoscaler sized the serving Deployment for, in replicas of the new configuration."""
    scaling = ctx.spec.scaling
    goodput_new = plan.chosen.goodput_requests_per_s
    proposed = rec.proposed if rec is not None else None
    if proposed is not None and proposed.goodput_requests_per_second > 0:
        goodput_new = proposed.goodput_requests_per_second  # calibrated on the served traffic
    goodput_old = ctx.decision.goodput_requests_per_s if ctx.decision is not None else None
    if goodput_old and goodput_new > 0:
        needed = math.ceil(ctx.replicas * goodput_old / goodput_new - 1e-9)
    else:  # the running configuration holds no SLO: its replica count says nothing; the day's peak does
        needed = proposed.peak_replicas if proposed is not None else ctx.replicas
    return min(max(needed, scaling.min_replicas, 1), scaling.max_replicas)


def _target_body(ctx: MoveContext, plan: MovePlan, to: ServingConfigurationStatus, replicas: int) -> dict[str, Any]:
    gpu = next(g for g in plan.inputs.gpus if g.name == plan.chosen.gpu_type)
    # Built from the resource's own spec, as the serving Deployment is once the move completes: the same body.
    return build_deployment(ctx.owner, ctx.spec, plan.chosen, replicas, gpu=gpu,
                            native_precision=plan.inputs.arch.native_precision, name=to.deployment,
                            configuration_label=to.label)


def _owned(ctx: MoveContext, live: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return live if live is not None and is_owned_by(live, ctx.owner.uid) else None


def _blocked(ctx: MoveContext, rec: RecommendationStatus, message: str | None) -> MoveStep:
    """No move in this pass; `message` (if any) says why in status.recommendation and in one Event."""
    events = []
    if message is not None and message != ctx.blocked_before:
        events.append(EventRecord("Warning", EventReason.MOVE_BLOCKED.value, message))
    status = ctx.status.model_copy(update={"recommendation": rec.model_copy(update={"move_blocked": message})})
    return MoveStep(status=status, active_replicas=ctx.replicas, events=tuple(events))


def _why_not(ctx: MoveContext, plan: MovePlan, replicas: int, name: str) -> str | None:
    scaling, chosen = ctx.spec.scaling, plan.chosen
    if ctx.multi_node or chosen.multi_node:
        return (f"Auto moves between single-node Deployments only; {chosen.label} (or the running one) spans "
                "nodes. Apply the recommendation by pinning it in the spec.")
    last = ctx.status.last_move_at
    if last is not None:
        next_at = datetime.fromisoformat(last) + timedelta(seconds=scaling.replan_move_interval_seconds)
        if ctx.now < next_at:
            return (f"The last move ended at {last}; the next may start at {format_time(next_at)} "
                    "(spec.scaling.replanMoveIntervalSeconds).")
    if name == ctx.serving_name:
        return f"Deployment {name} already serves; a move needs another."
    if ctx.target is not None and _owned(ctx, ctx.target) is None:
        return f"Deployment {ctx.owner.namespace}/{name} exists and is not owned by this LLMDeployment."
    free = ctx.free_replica_slots(chosen.gpu_type, chosen.gpus_per_pod)
    if free is None:
        return "The cluster's free GPUs are unknown (pods could not be listed); no move until they are."
    if free < replicas:
        return (f"The move needs {replicas} x {chosen.gpus_per_pod} {chosen.gpu_type} free beside the running "
                f"fleet ({replicas * chosen.gpus_per_pod} GPUs); the cluster has room for {free} such "
                "replica(s). Add nodes, or apply the recommendation by editing the spec.")
    return None


def _maybe_start(ctx: MoveContext) -> MoveStep:
    rec = ctx.status.recommendation
    idle = MoveStep(status=ctx.status, active_replicas=ctx.replicas)
    if ctx.spec.scaling.replan != ReplanMode.AUTO or rec is None or ctx.decision is None:
        return idle
    if not rec.recommended or rec.proposed is None:
        return _blocked(ctx, rec, None)
    plan = ctx.plan
    if plan is None:
        return _blocked(ctx, rec, (
            f"{rec.proposed.gpu_type} TP{rec.proposed.tensor_parallel} max-num-seqs {rec.proposed.max_num_seqs} "
            "does not hold the SLOs on the workload the spec declares, which the Deployment is planned on; "
            "set spec.workload to the served traffic (status.recommendation.served) to move to it."))
    if serving_flags(plan.chosen) == serving_flags(ctx.running):
        return _blocked(ctx, rec, None)
    label = configuration_label(plan.chosen, ctx.generation)
    to = ServingConfigurationStatus(
        gpu_type=plan.chosen.gpu_type, tensor_parallel=plan.chosen.tensor_parallel,
        pipeline_parallel=plan.chosen.pipeline_parallel, data_parallel=plan.chosen.data_parallel,
        max_num_seqs=plan.chosen.max_num_seqs,
        max_model_len=plan.chosen.max_model_len, deployment=f"{ctx.owner.name}-{label}", label=label,
        generation=ctx.generation)
    replicas = _new_replicas(ctx, plan, rec)
    why_not = _why_not(ctx, plan, replicas, to.deployment)
    if why_not is not None:
        return _blocked(ctx, rec, why_not)
    message = (f"Moving to {plan.chosen.label} ({rec.savings_pct:.0f}% less on the served traffic): Deployment "
               f"{to.deployment} starts {replicas} replica(s) beside {ctx.serving_name}, which keeps serving.")
    move = MoveStatus(phase=MovePhase.STARTING, to=to, from_deployment=ctx.serving_name, replicas=replicas,
                      started_at=format_time(ctx.now), message=message)
    write = workload_write(WriteKind.DEPLOYMENT, _target_body(ctx, plan, to, replicas), _owned(ctx, ctx.target),
                           replicas, None)
    status = ctx.status.model_copy(update={
        "move": move, "recommendation": rec.model_copy(update={"move_blocked": None})})
    return MoveStep(status=_counted(ctx, status), active_replicas=ctx.replicas,
                    writes=() if write is None else (write,),
                    events=(EventRecord("Normal", EventReason.MOVE_STARTED.value, message),))


def _counted(ctx: MoveContext, status: LLMDeploymentStatus) -> LLMDeploymentStatus:
    """Replicas of both Deployments while a move runs: the scale subresource's selector covers both."""
    current, ready = replica_counts(ctx.active)
    new_current, new_ready = replica_counts(_owned(ctx, ctx.target))
    return status.model_copy(update={"replicas": current + new_current, "ready_replicas": ready + new_ready})


def _rollback(ctx: MoveContext, move: MoveStatus, why: str) -> MoveStep:
    target = _owned(ctx, ctx.target)
    message = (f"Move to {move.to.gpu_type} TP{move.to.tensor_parallel} rolled back: {why}. {ctx.serving_name} "
               f"keeps serving; Deployment {move.to.deployment} is deleted.")
    deletes = () if target is None else (ObjectDelete(WriteKind.DEPLOYMENT, move.to.deployment,
                                                      str(target["metadata"]["uid"])),)
    status = ctx.status.model_copy(update={"move": None, "last_move_at": format_time(ctx.now)})
    return MoveStep(status=status, active_replicas=ctx.replicas, deletes=deletes,
                    events=(EventRecord("Warning", EventReason.MOVE_ROLLED_BACK.value, message),))


def _starting(ctx: MoveContext, move: MoveStatus) -> MoveStep:
    timeout = ctx.spec.scaling.replan_move_timeout_seconds
    if move.to.generation != ctx.generation:
        return _rollback(ctx, move, "the spec changed (kvscale plans from the new spec)")
    if ctx.now - datetime.fromisoformat(move.started_at) >= timedelta(seconds=timeout):
        return _rollback(ctx, move, f"its replicas were not all Ready within {timeout} s "
                                    "(spec.scaling.replanMoveTimeoutSeconds)")
    if ctx.plan is None:
        return _rollback(ctx, move, "the configuration no longer has a feasible plan on the spec")
    if ctx.target is not None and _owned(ctx, ctx.target) is None:
        return _rollback(ctx, move, f"Deployment {move.to.deployment} was taken by another owner")
    replicas = move.replicas
    if ctx.decision is not None:  # the demand grew: so does the new fleet (it never shrinks mid-move)
        replicas = max(replicas, _new_replicas(ctx, ctx.plan, ctx.status.recommendation))
    target = _owned(ctx, ctx.target)
    write = workload_write(WriteKind.DEPLOYMENT, _target_body(ctx, ctx.plan, move.to, replicas), target, replicas,
                           None)
    live_replicas = int(((ctx.active or {}).get("spec") or {}).get("replicas") or 0)
    _, ready = replica_counts(target)
    writes = () if write is None else (write,)
    if target is not None and write is None and ready >= replicas:
        message = (f"{ready} replica(s) of {move.to.deployment} Ready: {ctx.serving_name} is scaled to 0; its pods "
                   "leave the Service as they stop and finish the requests they hold first.")
        status = ctx.status.model_copy(update={"move": move.model_copy(update={
            "phase": MovePhase.DRAINING, "replicas": replicas, "message": message})})
        return MoveStep(status=_counted(ctx, status), active_replicas=0, writes=writes,
                        events=(EventRecord("Normal", EventReason.MOVE_SWITCHED.value, message),))
    message = (f"Waiting for {replicas} replica(s) of {move.to.deployment} to be Ready ({ready} so far); "
               f"{ctx.serving_name} keeps serving.")
    status = ctx.status.model_copy(update={"move": move.model_copy(update={"replicas": replicas,
                                                                           "message": message})})
    # The serving fleet never shrinks while the new one starts: capacity stays at or above the demand.
    return MoveStep(status=_counted(ctx, status), active_replicas=max(ctx.replicas, live_replicas), writes=writes)


def _draining(ctx: MoveContext, move: MoveStatus) -> MoveStep:
    target = _owned(ctx, ctx.target)
    if target is None or ctx.plan is None:
        # The new fleet vanished after the switch (deleted by hand?): the old one serves again; start over.
        back = move.model_copy(update={"phase": MovePhase.STARTING, "started_at": format_time(ctx.now),
                                       "message": f"Deployment {move.to.deployment} is gone: {ctx.serving_name} "
                                                  "is scaled back up and the move starts again."})
        status = ctx.status.model_copy(update={"move": back})
        if ctx.plan is None:
            return _rollback(ctx, move, "the configuration no longer has a feasible plan on the spec")
        return MoveStep(status=_counted(ctx, status), active_replicas=max(ctx.replicas, 1))
    write = workload_write(WriteKind.DEPLOYMENT, _target_body(ctx, ctx.plan, move.to, move.replicas), target,
                           move.replicas, None)
    writes = () if write is None else (write,)
    current, _ = replica_counts(ctx.active)
    live_replicas = int(((ctx.active or {}).get("spec") or {}).get("replicas") or 0)
    if ctx.active is not None and (live_replicas > 0 or current > 0):
        return MoveStep(status=_counted(ctx, ctx.status), active_replicas=0, writes=writes)
    message = (f"Moved to {move.to.gpu_type} TP{move.to.tensor_parallel} max-num-seqs {move.to.max_num_seqs}: "
               f"{move.to.deployment} serves with {move.replicas} replica(s); {ctx.serving_name} drained and deleted.")
    deletes = () if ctx.active is None else (ObjectDelete(WriteKind.DEPLOYMENT, ctx.serving_name,
                                                          str(ctx.active["metadata"]["uid"])),)
    new_current, new_ready = replica_counts(target)
    status = ctx.status.model_copy(update={
        "move": None, "serving": move.to, "last_move_at": format_time(ctx.now), "desired_replicas": move.replicas,
        "replicas": new_current, "ready_replicas": new_ready})
    return MoveStep(status=status, active_replicas=None, writes=writes, deletes=deletes,
                    events=(EventRecord("Normal", EventReason.MOVE_COMPLETED.value, message),))


def leftover_deployments(owner: Owner, labelled: Sequence[Mapping[str, Any]], keep: Sequence[str],
                         settled: bool) -> tuple[ObjectDelete, ...]:
    """Deployments an interrupted move left behind (owned, carrying a configuration label, neither serving nor
    being moved to), deleted only once no move runs and the serving Deployment is Ready (`settled`)."""
    if not settled:
        return ()
    deletes = []
    for live in labelled:
        meta = live.get("metadata") or {}
        if (is_owned_by(live, owner.uid) and meta.get("name") not in keep
                and CONFIGURATION_LABEL in (meta.get("labels") or {})):
            deletes.append(ObjectDelete(WriteKind.DEPLOYMENT, str(meta["name"]), str(meta["uid"]), (EventRecord(
                "Normal", EventReason.WORKLOAD_REPLACED.value,
                f"Deleted Deployment {meta['name']}: left by an interrupted move; it serves no configuration."),)))
    return tuple(deletes)

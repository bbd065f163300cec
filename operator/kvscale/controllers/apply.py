"""The edge of a reconcile pass: read the `World`, and write what an `Intent` changes.

Owned objects are written with server-side apply under the `kvscale` field manager. A first apply
is not forced: when another writer changed a field kvscale manages, the API server answers 409 and
names it, kvscale says so in an Event, then applies again with force (it is the objects' controller).
The status is a merge patch that sends every field it clears as null, with the resourceVersion it was
computed from: if the resource changed since it was read, the write is refused (409) and the pass is
run again on a fresh read. A refused object write does not stop the pass: the rest is written, and
the status says which write failed and why.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvscale.controllers.autoscaling import ScalingInput
from kvscale.controllers.backoff import Backoff, fingerprint
from kvscale.controllers.desire import previous_status, same_status, settle, status_dict
from kvscale.controllers.events import EventReason
from kvscale.controllers.world import (
    Intent,
    ObjectDelete,
    ObjectWrite,
    PassReport,
    ScaleDownPrep,
    World,
    WriteFailure,
    WriteKind,
)
from kvscale.kube.builders import OWNER_LABEL
from kvscale.kube.cluster import FIELD_MANAGER, Cluster, EventRecord, KubeApiError
from kvscale.kube.drain import DELETION_COST_ANNOTATION, deletion_costs
from kvscale.kube.leaderworkerset import leader_worker_set_name

log = logging.getLogger("kvscale.reconcile")
_MANAGER = re.compile(r'conflicts? with "([^"]+)"')


def read_world(cluster: Cluster, body: Mapping[str, Any], now: datetime, scaling: ScalingInput | None,
               in_flight_by_pod: Mapping[str, float] | None = None) -> World:
    """Every read one pass needs, before anything is decided."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    ref = ((body.get("spec") or {}).get("model") or {}).get("configMapRef")
    config_name = ref.get("name") if isinstance(ref, Mapping) else None
    served = cluster.leader_worker_sets() is not None
    status = previous_status(body)
    active = status.serving.deployment if status is not None and status.serving is not None else name
    target = status.move.to.deployment if status is not None and status.move is not None else None
    replan = ((body.get("spec") or {}).get("scaling") or {}).get("replan")
    moves = replan == "Auto" or active != name or target is not None
    return World(
        body=body,
        deployment=cluster.get_deployment(namespace, active),
        move_target=cluster.get_deployment(namespace, target) if target else None,
        # only where moves happen (a list per pass costs the API server at a thousand resources)
        labelled_deployments=cluster.list_deployments(namespace, {OWNER_LABEL: name}) if moves else (),
        service=cluster.get_service(namespace, name),
        nodes=cluster.list_nodes(),
        config_map=cluster.get_config_map(namespace, str(config_name)) if config_name else None,
        now=now,
        scaling=scaling,
        in_flight_by_pod=in_flight_by_pod,
        leader_worker_set=cluster.get_leader_worker_set(namespace, leader_worker_set_name(name)) if served else None,
        leader_worker_sets_served=served,
    )


@dataclass(frozen=True)
class Applied:
    intent: Intent  # as settled: the status that was (or should have been) written
    report: PassReport
    backoff: Backoff
    stale: bool = False  # the status write was refused because the resource changed since it was read


def _other_managers(detail: str) -> list[str]:
    return [m for m in _MANAGER.findall(detail) if m != FIELD_MANAGER]


def _apply_owned(cluster: Cluster, write: ObjectWrite) -> str | None:
    """Apply one owned object; returns the conflict that had to be forced, if another writer caused one."""
    try:
        cluster.apply(write.body)
        return None
    except KubeApiError as exc:
        if not exc.conflict or write.action == "create":
            raise  # a create that conflicts met an object someone else made meanwhile: never taken over
        cluster.apply(write.body, force=True)
        return exc.detail if _other_managers(exc.detail) else None  # kvscale's own older entries: no news


class Writer:
    """Writes one Intent through `cluster`, emitting Events as writes succeed."""

    def __init__(self, cluster: Cluster, world: World, backoff: Backoff, now_s: float) -> None:
        self.cluster, self.world, self.backoff, self.now_s = cluster, world, backoff, now_s
        self.written: list[str] = []
        self.failures: list[WriteFailure] = []  # including writes held back by their back-off
        self.refused: list[WriteFailure] = []  # tried and refused in this pass
        self.conflicts: list[str] = []
        self.emitted: list[EventRecord] = []
        self.status_version: str | None = None

    def emit(self, event: EventRecord) -> None:
        self.emitted.append(event)
        try:
            self.cluster.emit_event(self.world.body, event, self.world.now)
        except KubeApiError as exc:  # an Event is best effort; the status carries the same facts
            log.debug("could not emit event %s: %s", event.reason, exc)

    def deletion_costs(self, prep: ScaleDownPrep) -> None:
        """Best effort: without the costs the ReplicaSet picks pods by its own ranking, and the preStop drain
        still lets their requests finish, so a refusal (RBAC without pods/patch, say) does not hold the scale."""
        try:
            pods = self.cluster.list_pods(prep.namespace, prep.selector)
            costs = deletion_costs(pods, prep.selector, prep.in_flight_by_pod)
            for cost in costs:
                self.cluster.annotate_pod(prep.namespace, cost.pod, {DELETION_COST_ANNOTATION: str(cost.cost)})
        except KubeApiError as exc:
            log.warning("could not set pod-deletion-cost before scaling down %s: %s", prep.namespace, exc)
            return
        if costs:
            self.written.append(f"annotate {len(costs)} pod(s)")

    def object(self, write: ObjectWrite) -> None:
        body_print = fingerprint(write.body)
        held = self.backoff.waiting(write.kind, body_print, self.now_s)
        if held is not None:
            self.failures.append(held)
            return
        try:
            conflict = _apply_owned(self.cluster, write)
        except KubeApiError as exc:
            failure = WriteFailure(write.kind, write.action, exc.status, exc.detail)
            self.failures.append(failure)
            self.refused.append(failure)
            self.backoff = self.backoff.record(write.kind, body_print, failure, self.now_s)
            return
        self.backoff = self.backoff.record(write.kind, body_print, None, self.now_s)
        self.written.append(f"{write.action} {write.kind}")
        if conflict is not None:
            self.conflicts.append(conflict)
            name = write.body["metadata"]["name"]
            self.emit(EventRecord("Warning", EventReason.FIELD_CONFLICT.value,
                                  f"{write.kind} {name}: another writer changed fields kvscale manages ({conflict}); "
                                  "kvscale put its values back. Change the LLMDeployment instead (for a manual "
                                  "replica count: scaling.mode Off and spec.replicas)."))
        for event in write.events:
            self.emit(event)

    def delete(self, delete: ObjectDelete) -> None:
        namespace = self.world.body["metadata"]["namespace"]
        try:
            self.cluster.delete_owned(delete.kind.value, namespace, delete.name, delete.uid)
        except KubeApiError as exc:
            failure = WriteFailure(delete.kind, "delete", exc.status, exc.detail)
            self.failures.append(failure)
            self.refused.append(failure)
            return
        self.written.append(f"delete {delete.kind}")
        for event in delete.events:
            self.emit(event)

    def status(self, intent: Intent) -> bool:
        """Write the status if it changed; False when it was refused (other than by a 409, which raises)."""
        if same_status(previous_status(self.world.body), intent.status):
            self.backoff = self.backoff.clear(WriteKind.STATUS)
            return True
        meta = self.world.body["metadata"]
        body = status_dict(intent.status)
        body_print = fingerprint(body)
        held = self.backoff.waiting(WriteKind.STATUS, body_print, self.now_s)
        if held is not None:
            self.failures.append(held)
            return False
        try:
            written = self.cluster.patch_llmdeployment_status(meta["namespace"], meta["name"], body,
                                                              resource_version=meta.get("resourceVersion"))
        except KubeApiError as exc:
            if exc.conflict:
                raise  # the resource changed since it was read: the caller reads it again and re-runs
            failure = WriteFailure(WriteKind.STATUS, "patch", exc.status, exc.detail)
            if self.backoff.is_new(WriteKind.STATUS, failure):
                self.emit(EventRecord("Warning", EventReason.STATUS_WRITE_FAILED.value,
                                      f"Could not write the status: {exc.detail}. kvscale retries with back-off; "
                                      "check kvscale's RBAC for llmdeployments/status and the API server."))
            self.failures.append(failure)
            self.refused.append(failure)
            self.backoff = self.backoff.record(WriteKind.STATUS, body_print, failure, self.now_s)
            return False
        self.backoff = self.backoff.record(WriteKind.STATUS, body_print, None, self.now_s)
        self.written.append("patch status")
        self.status_version = (written.get("metadata") or {}).get("resourceVersion")
        return True


def apply_intent(cluster: Cluster, world: World, intent: Intent, backoff: Backoff) -> Applied:
    """Write the objects, then the status (with the outcome of the object writes), then the Events.

    The Events that describe the status (Planned, Infeasible, WriteFailed, ...) go out only once the
    status that records them is written, so a refused status write does not repeat them every pass.
    """
    writer = Writer(cluster, world, backoff, world.now.timestamp())
    if intent.scale_down is not None:  # before the Deployment loses replicas: the ReplicaSet reads them then
        writer.deletion_costs(intent.scale_down)
    for write in intent.writes:
        writer.object(write)
    if not writer.failures:  # the old kind goes only once the new one is written
        for delete in intent.deletes:
            writer.delete(delete)
    settled = settle(intent, world, writer.failures)
    stale = False
    try:
        if writer.status(settled):
            for event in settled.events:
                writer.emit(event)
    except KubeApiError:  # 409 only: Writer.status records every other refusal
        stale = True
    report = PassReport(written=tuple(writer.written), failures=tuple(writer.failures),
                        refused=tuple(writer.refused), conflicts=tuple(writer.conflicts),
                        events=tuple(writer.emitted), status_version=writer.status_version)
    return Applied(intent=settled, report=report, backoff=writer.backoff, stale=stale)


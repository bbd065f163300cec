"""The writes of a workload (a Deployment or LeaderWorkerSet): what changed between the desired object and the
live one, as one ObjectWrite with the Events that say so (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvscale.controllers.events import EventReason
from kvscale.controllers.world import ObjectWrite, WriteKind
from kvscale.kube.builders import SPEC_HASH_ANNOTATION
from kvscale.kube.cluster import EventRecord
from kvscale.kube.state import template_drifted


def _args(workload: Mapping[str, Any]) -> str:
    """The serving container's args: the Deployment's pod, or a LeaderWorkerSet's leader."""
    spec = workload["spec"]
    template = spec["leaderWorkerTemplate"]["leaderTemplate"] if "leaderWorkerTemplate" in spec else spec["template"]
    return " ".join(template["spec"]["containers"][0]["args"])


def _template_hash(workload: Mapping[str, Any]) -> str | None:
    spec = workload.get("spec") or {}
    template = ((spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") if "leaderWorkerTemplate" in spec
                else spec.get("template")) or {}
    value = ((template.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    return str(value) if value is not None else None


_CREATED = {WriteKind.DEPLOYMENT: EventReason.DEPLOYMENT_CREATED,
            WriteKind.LEADER_WORKER_SET: EventReason.LEADER_WORKER_SET_CREATED}
_UPDATED = {WriteKind.DEPLOYMENT: EventReason.DEPLOYMENT_UPDATED,
            WriteKind.LEADER_WORKER_SET: EventReason.LEADER_WORKER_SET_UPDATED}


def workload_write(kind: WriteKind, desired: dict[str, Any], live: Mapping[str, Any] | None,
                   replicas: int, scale_reason: str | None) -> ObjectWrite | None:
    """The write that makes the Deployment (or LeaderWorkerSet) what the plan builds, if any is needed."""
    unit = "replica(s)" if kind == WriteKind.DEPLOYMENT else "group(s)"
    name = desired["metadata"]["name"]
    if live is None:
        return ObjectWrite(kind, "create", desired, (EventRecord(
            "Normal", _CREATED[kind].value, f"Created {kind} {name} with {replicas} {unit}: {_args(desired)}"),))
    events = []
    action = None
    if template_drifted(desired, live):
        action = "update"
        if _template_hash(live) == _template_hash(desired):
            events.append(EventRecord("Warning", EventReason.DRIFT_CORRECTED.value,
                                      f"{kind} {name} was edited outside kvscale; its pod template was put "
                                      "back. Change the LLMDeployment instead."))
        else:
            events.append(EventRecord("Normal", _UPDATED[kind].value,
                                      f"Rolling {kind} {name} to the new plan: {_args(desired)}"))
    live_replicas = (live.get("spec") or {}).get("replicas")
    if int(live_replicas or 0) != replicas:
        action = action or "scale"
        events.append(EventRecord("Normal", EventReason.SCALED.value,
                                  scale_reason or f"Replicas {live_replicas} -> {replicas}."))
    if action is None:
        return None
    return ObjectWrite(kind, action, desired, tuple(events))

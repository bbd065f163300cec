"""The values one reconcile pass works with: what it read (`World`) and what it wants (`Intent`).

Observe -> desire -> act: the edge (`controllers.apply`) reads a `World`, the pure
`controllers.desire.desire` turns it into an `Intent`, and the edge writes the difference. Both are
plain frozen values, so every state transition is unit-tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from kvscale.api.status import LLMDeploymentStatus
from kvscale.autoscaler import ScaleDecision
from kvscale.controllers.autoscaling import ScalingInput
from kvscale.kube.cluster import EventRecord


@dataclass(frozen=True)
class World:
    """Everything one pass read about one LLMDeployment, read before anything is decided."""

    body: Mapping[str, Any]  # the LLMDeployment (metadata, spec, status) as the API server returned it
    # the Deployment that serves: the resource's name, or the one the last move put in force (status.serving);
    # owned or not; None: absent
    deployment: Mapping[str, Any] | None
    service: Mapping[str, Any] | None  # the Service of the same name, owned or not; None: absent
    nodes: Sequence[Mapping[str, Any]]
    config_map: Mapping[str, Any] | None  # the ConfigMap spec.model.configMapRef names; None: absent or none named
    now: datetime
    scaling: ScalingInput | None = None  # fresh metrics (once per resync); None: replicas stay as decided
    # requests running + waiting per pod name, from the last resync's metrics (any pass may scale down:
    # a spec edit too); None: unknown
    in_flight_by_pod: Mapping[str, float] | None = None
    # the LeaderWorkerSet of the same name (multi-node replicas), owned or not; None: absent or not served
    leader_worker_set: Mapping[str, Any] | None = None
    leader_worker_sets_served: bool = False  # whether the API server serves leaderworkersets (LWS installed)
    # Re-planning's moves (spec.scaling.replan: Auto): the Deployment a move in progress brings up (status.move),
    # owned or not; and every Deployment labelled as the resource's (owned ones left by an interrupted move)
    move_target: Mapping[str, Any] | None = None
    labelled_deployments: Sequence[Mapping[str, Any]] = ()


class WriteKind(StrEnum):
    """The objects kvscale writes, and the order it writes them in."""

    DEPLOYMENT = "Deployment"
    LEADER_WORKER_SET = "LeaderWorkerSet"
    SERVICE = "Service"
    STATUS = "status"


@dataclass(frozen=True)
class ObjectWrite:
    """One owned object to apply (server-side apply of the whole desired object)."""

    kind: WriteKind
    action: str  # create, update or scale: what the write does, for logs, telemetry and messages
    body: Mapping[str, Any]
    events: tuple[EventRecord, ...] = ()  # emitted once the write has succeeded


@dataclass(frozen=True)
class ObjectDelete:
    """An owned object of the kind the plan no longer uses (a Deployment once replicas span nodes, or the
    reverse), deleted only if its uid is still the one kvscale read: never a newer object of that name."""

    kind: WriteKind
    name: str
    uid: str
    events: tuple[EventRecord, ...] = ()  # emitted once the delete has succeeded


@dataclass(frozen=True)
class WriteFailure:
    """A write the API server refused (or that is waiting out its back-off after a refusal)."""

    kind: WriteKind
    action: str
    status_code: int  # HTTP status; 0 when no response came back
    message: str


@dataclass(frozen=True)
class ScaleDownPrep:
    """Before a scale-down: the deployment's pods (by `selector` in `namespace`) get their requests in flight
    as pod-deletion-cost, so the ReplicaSet removes the idle ones (kube/drain.py)."""

    namespace: str
    selector: Mapping[str, str]
    in_flight_by_pod: Mapping[str, float]


@dataclass(frozen=True)
class Intent:
    """What the resource should look like after this pass."""

    status: LLMDeploymentStatus
    writes: tuple[ObjectWrite, ...] = ()
    events: tuple[EventRecord, ...] = ()  # about the resource itself (plan, conditions), emitted after the writes
    decision: ScaleDecision | None = None  # the autoscaler's answer, when this pass scaled
    tracks_writes: bool = False  # whether the WriteFailed condition applies (a feasible plan kvscale acts on)
    scale_down: ScaleDownPrep | None = None  # written before the Deployment when it loses replicas
    deletes: tuple[ObjectDelete, ...] = ()  # after the writes, and only when every write succeeded


@dataclass(frozen=True)
class PassReport:
    """What the edge did with an Intent (for logs, telemetry, back-off and tests)."""

    written: tuple[str, ...] = ()  # e.g. "create Deployment", "patch status"
    failures: tuple[WriteFailure, ...] = ()  # every write still failing, refused now or waiting out its back-off
    refused: tuple[WriteFailure, ...] = ()  # the writes the API server refused in this pass
    conflicts: tuple[str, ...] = ()  # field-manager conflicts that were forced
    events: tuple[EventRecord, ...] = ()  # the Events emitted
    status_version: str | None = None  # the resourceVersion the status write produced, when it wrote

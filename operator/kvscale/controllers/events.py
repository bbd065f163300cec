"""The catalogue of Event reasons kvscale emits, one per kind of decision."""

from __future__ import annotations

from enum import StrEnum


class EventReason(StrEnum):
    PLANNED = "Planned"
    INFEASIBLE = "Infeasible"
    LEADER_WORKER_SET_NOT_INSTALLED = "LeaderWorkerSetNotInstalled"
    MULTI_NODE_NOT_RUNNABLE = "MultiNodeNotRunnable"
    INVALID_SPEC = "InvalidSpec"
    DEPLOYMENT_CREATED = "DeploymentCreated"
    DEPLOYMENT_UPDATED = "DeploymentUpdated"
    LEADER_WORKER_SET_CREATED = "LeaderWorkerSetCreated"
    LEADER_WORKER_SET_UPDATED = "LeaderWorkerSetUpdated"
    WORKLOAD_REPLACED = "WorkloadReplaced"
    DRIFT_CORRECTED = "DriftCorrected"
    SERVICE_CREATED = "ServiceCreated"
    NAME_CONFLICT = "NameConflict"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    CAPACITY_AVAILABLE = "CapacityAvailable"
    SCALED = "Scaled"
    SCALE_RECOMMENDED = "ScaleRecommended"
    REPLAN_RECOMMENDED = "ReplanRecommended"
    MOVE_STARTED = "MoveStarted"
    MOVE_SWITCHED = "MoveSwitched"
    MOVE_COMPLETED = "MoveCompleted"
    MOVE_ROLLED_BACK = "MoveRolledBack"
    MOVE_BLOCKED = "MoveBlocked"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    METRICS_AVAILABLE = "MetricsAvailable"
    WRITE_FAILED = "WriteFailed"
    WRITES_RECOVERED = "WritesRecovered"
    FIELD_CONFLICT = "FieldConflict"
    STATUS_WRITE_FAILED = "StatusWriteFailed"

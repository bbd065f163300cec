"""One reconcile of one LLMDeployment, by level: read the world, decide, write the difference.

    read_world (edge) -> desire (pure) -> apply_intent (edge)

Idempotent: an unchanged resource in an unchanged cluster writes nothing. When the resource changed
between the read and the status write (409), the pass runs once more on a fresh read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kvscale.api.status import LLMDeploymentStatus
from kvscale.autoscaler import ScaleDecision
from kvscale.controllers.apply import apply_intent, read_world
from kvscale.controllers.autoscaling import ScalingInput
from kvscale.controllers.backoff import Backoff
from kvscale.controllers.desire import desire
from kvscale.controllers.world import WriteFailure
from kvscale.kube.cluster import Cluster, EventRecord

RERUNS_ON_CONFLICT = 1


@dataclass
class Outcome:
    """What one reconcile did (for logs, telemetry and tests)."""

    writes: list[str] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    failures: list[WriteFailure] = field(default_factory=list)  # writes still failing (status says which)
    refused: list[WriteFailure] = field(default_factory=list)  # writes the API server refused in this pass
    conflicts: list[str] = field(default_factory=list)  # field-manager conflicts kvscale forced
    status: LLMDeploymentStatus | None = None  # the status as reconciled
    decision: ScaleDecision | None = None  # the autoscaler's answer, when this pass scaled
    backoff: Backoff = field(default_factory=Backoff)  # refused writes still to retry
    reruns: int = 0  # passes run again because the resource changed under the status write
    status_version: str | None = None  # the resource's resourceVersion after this pass's status write


class Reconciler:
    """Reconciles LLMDeployments against one cluster."""

    def __init__(self, cluster: Cluster, default_prices_usd_per_hour: Mapping[str, float] | None = None) -> None:
        self.cluster = cluster
        self.default_prices = dict(default_prices_usd_per_hour or {})

    def reconcile(self, body: Mapping[str, Any], now: datetime, scaling: ScalingInput | None = None,
                  backoff: Backoff | None = None, in_flight_by_pod: Mapping[str, float] | None = None) -> Outcome:
        """Bring one resource in line. `scaling` (fresh metrics, once per resync cycle) lets the
        autoscaler act; without it replicas stay where the last decision put them. `backoff` holds
        the writes refused in earlier passes; `in_flight_by_pod`, the pods' requests in flight as last
        measured (which pods a scale-down spares)."""
        outcome = Outcome(backoff=backoff or Backoff())
        meta = body["metadata"]
        for attempt in range(RERUNS_ON_CONFLICT + 1):
            world = read_world(self.cluster, body, now, scaling, in_flight_by_pod)
            intent = desire(world, self.default_prices)
            applied = apply_intent(self.cluster, world, intent, outcome.backoff)
            report = applied.report
            outcome.writes += report.written
            outcome.events += report.events
            outcome.failures = list(report.failures)
            outcome.refused += report.refused
            outcome.conflicts += report.conflicts
            outcome.status_version = report.status_version or outcome.status_version
            outcome.status, outcome.decision, outcome.backoff = applied.intent.status, intent.decision, applied.backoff
            if not applied.stale or attempt == RERUNS_ON_CONFLICT:
                break  # a status still stale after the rerun waits for the next trigger (the change's own event)
            fresh = self.cluster.get_llmdeployment(meta["namespace"], meta["name"])
            if fresh is None or fresh["metadata"].get("deletionTimestamp"):
                break
            body, outcome.reruns = fresh, outcome.reruns + 1
        return outcome

"""kopf wiring: watch LLMDeployments and the Deployments kvscale owns, and resync on an interval.

Reconciliation is by level: every trigger re-reads the resource and runs the same idempotent
reconcile. kvscale registers no change handlers, timers or daemons, so kopf keeps no progress in the
objects and adds no finalizers: a restart over unchanged resources writes nothing, and deleting a
resource never waits for the operator (owner references remove its Deployment and Service).
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from kvscale.api.spec import API_GROUP, API_VERSION, KIND
from kvscale.autoscaler import Observation, ScalingHistory
from kvscale.autoscaler.forecast import BUCKET_S, forecasts_from
from kvscale.controllers.autoscaling import ScalingInput
from kvscale.controllers.backoff import Backoff
from kvscale.controllers.peering import DEFAULT_PEERING_LIFETIME_S, PeerIdentity, is_active
from kvscale.controllers.reconcile import Outcome, Reconciler
from kvscale.controllers.telemetry import Telemetry
from kvscale.errors import KvscaleError
from kvscale.kube.cluster import PLURAL, Cluster, use_kubeconfig
from kvscale.metrics import DEFAULT_WINDOW_S, DeploymentKey, MetricsUnavailableError, PrometheusSource

log = logging.getLogger("kvscale.operator")
MANAGED_BY = {"app.kubernetes.io/managed-by": "kvscale"}


# The liveness probe fails once the resync loop has completed no pass for this many intervals
# (and at least LIVENESS_MIN_STALL_S): a wedged loop means nothing is autoscaled any more.
LIVENESS_INTERVALS = 3
# After a restart, each deployment's forecasts are seeded with this much of its arrivals history: two days
# and a bit, so that the daily season (one day to learn, then scored) is there again at once.
FORECAST_HISTORY_S = 2.5 * 86_400.0
LIVENESS_MIN_STALL_S = 60.0
# The pods' requests in flight, read each resync, rank the pods of a scale-down (pod-deletion-cost) while
# younger than this many intervals and at least IN_FLIGHT_MIN_AGE_S: a pass on a loaded control plane
# takes longer than an interval, and figures left out then leave the pick to the ReplicaSet's own ranking,
# while a count of requests that last tens of seconds still ranks the pods half a minute later (on the
# bed's 2-s interval, a bound of two intervals alone dropped the costs of one cold CI's scale-down).
IN_FLIGHT_INTERVALS = 2
IN_FLIGHT_MIN_AGE_S = 30.0
# Handlers are I/O-bound (API calls); kopf's default pool (CPUs + 4) starves a burst of resources.
HANDLER_WORKERS = 8


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    scan_interval_s: float = 30.0
    kubeconfig: str | None = None
    prometheus_url: str | None = None  # None: no live metrics, plans only
    gpu_prices_usd_per_hour: Mapping[str, float] = field(default_factory=dict)  # operator-wide defaults
    peering: str | None = None  # kopf peering name for HA (only one active replica); None: standalone
    peer: PeerIdentity | None = None  # how this operator registers in the peering (with `peering`)
    peering_lifetime_s: int = DEFAULT_PEERING_LIFETIME_S  # a peer silent for longer is dead: the handover bound
    metrics_port: int | None = None  # the operator's own /metrics
    # The rate window of the Prometheus queries (kvscale.metrics.source): at least a few scrapes of the serving pods.
    metrics_window_s: int = DEFAULT_WINDOW_S
    liveness_stall_s: float | None = None  # None: max(LIVENESS_INTERVALS x scan interval, LIVENESS_MIN_STALL_S)

    @property
    def in_flight_max_age_s(self) -> float:
        """How old the pods' requests in flight may be to rank the pods of a scale-down."""
        return max(IN_FLIGHT_INTERVALS * self.scan_interval_s, IN_FLIGHT_MIN_AGE_S)

    @property
    def stall_limit_s(self) -> float:
        """How long the resync loop may go without completing a pass before the operator is not live."""
        if self.liveness_stall_s is not None:
            return self.liveness_stall_s
        return max(LIVENESS_INTERVALS * self.scan_interval_s, LIVENESS_MIN_STALL_S)


@dataclass
class OperatorState:
    """What the handlers share: the cluster client, one lock per resource, counters for probes."""

    config: OperatorConfig
    telemetry: Telemetry = field(default_factory=Telemetry)
    cluster: Cluster | None = None
    metrics: PrometheusSource | None = None
    histories: dict[tuple[str, str], ScalingHistory] = field(default_factory=dict)
    # requests in flight per pod as the last resync read them, with when (time.monotonic)
    in_flight: dict[tuple[str, str], tuple[float, dict[str, float]]] = field(default_factory=dict)
    backoffs: dict[tuple[str, str], Backoff] = field(default_factory=dict)
    problems: dict[tuple[str, str], str] = field(default_factory=dict)  # what was last logged, per resource
    bindings: dict[tuple[str, str], str] = field(default_factory=dict)  # the autoscaler's last (action binding)
    own_versions: dict[tuple[str, str], str] = field(default_factory=dict)  # after kvscale's last status write
    locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)
    reconciles: int = 0
    failures: int = 0  # passes that failed outright (a read or the API server failed)
    refused_writes: int = 0  # writes the API server refused (the pass went on)
    conflicts: int = 0  # field-manager conflicts forced, and status writes rerun after a 409
    writes: int = 0
    resyncs: int = 0  # resync passes completed
    role: str = "standalone"  # standalone, or with peering: active or standby (as of the last resync)
    last_resync_s: float = field(default_factory=time.monotonic)  # when the last one completed (or start-up)
    stopping: threading.Event = field(default_factory=threading.Event)

    def _lock(self, key: tuple[str, str]) -> threading.Lock:
        with self.guard:
            return self.locks.setdefault(key, threading.Lock())

    def reconcile(self, namespace: str, name: str, scaling: ScalingInput | None = None) -> Outcome | None:
        """Re-read the resource and reconcile it; never raises (a failure is logged, once per change
        of error, and retried on the next event or resync)."""
        if self.cluster is None or self.stopping.is_set():
            return None  # shutting down: queued triggers are dropped, the next start resyncs anyway
        key = (namespace, name)
        with self._lock(key):
            try:
                body = self.cluster.get_llmdeployment(namespace, name)
                if body is None or body["metadata"].get("deletionTimestamp"):
                    self._forget(key)
                    return None
                reconciler = Reconciler(self.cluster, self.config.gpu_prices_usd_per_hour)
                if scaling is not None:  # the history may have moved since the cycle began
                    scaling = replace(scaling, history=self.histories.get(key, ScalingHistory()))
                outcome = reconciler.reconcile(body, datetime.now(UTC), scaling, self.backoffs.get(key),
                                               self._in_flight(key))
            except Exception as exc:  # the operator must outlive any one resource's failure
                self.failures += 1
                self.telemetry.reconciles.labels(result="error").inc()
                self._report(key, f"reconcile failed: {exc}", exc)
                return None
            self.reconciles += 1
            self.writes += len(outcome.writes)
            self.refused_writes += len(outcome.refused)
            self.conflicts += len(outcome.conflicts) + outcome.reruns
            self.telemetry.reconciles.labels(result="refused" if outcome.failures else "ok").inc()
            for write in outcome.writes:
                self.telemetry.writes.labels(kind=write).inc()
            if outcome.status_version is not None:
                self.own_versions[key] = outcome.status_version
            if outcome.backoff.refusals:
                self.backoffs[key] = outcome.backoff
            else:
                self.backoffs.pop(key, None)
            if outcome.decision is not None:
                self.histories[key] = outcome.decision.history
                self.telemetry.decisions.labels(namespace, name, outcome.decision.action).inc()
                # status keeps only changes of the replica count; the log also says why a fleet stays as it
                # is, once per change of what binds (every decision at debug level)
                decision, said = outcome.decision, f"{outcome.decision.action} {outcome.decision.binding}"
                level = logging.INFO if self.bindings.get(key) != said else logging.DEBUG
                self.bindings[key] = said
                log.log(level, "autoscaler %s/%s [%s]: %s", namespace, name, decision.binding, decision.reason)
            self._record(namespace, name, outcome)
            self._report(key, "; ".join(f"{f.action} {f.kind} refused: {f.message}" for f in outcome.failures))
            if outcome.writes:
                log.info("reconciled %s/%s: %s", namespace, name, ", ".join(outcome.writes))
            return outcome

    def _in_flight(self, key: tuple[str, str]) -> dict[str, float] | None:
        """The pods' requests in flight from the last resync, unless older than `in_flight_max_age_s`."""
        read = self.in_flight.get(key)
        if read is None or time.monotonic() - read[0] > self.config.in_flight_max_age_s:
            return None
        return read[1]

    def _report(self, key: tuple[str, str], problem: str, exc: Exception | None = None) -> None:
        """Log a resource's problem once per change of it (not once per pass), and its recovery."""
        before = self.problems.get(key, "")
        if problem == before:
            return
        where = "/".join(part for part in key if part)  # namespace/name, or the loop's own ("resync")
        if problem:
            self.problems[key] = problem
            log.warning("%s: %s (said once until it changes)", where, problem,
                        exc_info=exc is not None and not isinstance(exc, KvscaleError))
        else:
            self.problems.pop(key, None)
            log.info("%s: recovered (was: %s)", where, before)

    def _forget(self, key: tuple[str, str]) -> None:
        self.histories.pop(key, None)
        self.bindings.pop(key, None)
        self.in_flight.pop(key, None)
        self.backoffs.pop(key, None)
        self.problems.pop(key, None)
        self.own_versions.pop(key, None)

    def is_own_write(self, namespace: str, name: str, resource_version: str | None) -> bool:
        """Whether a watch event only echoes kvscale's own status write (nothing else changed since)."""
        return resource_version is not None and self.own_versions.get((namespace, name)) == resource_version

    def _record(self, namespace: str, name: str, outcome: Outcome) -> None:
        status = outcome.status
        if status is None:
            return
        if status.desired_replicas is not None:
            self.telemetry.desired_replicas.labels(namespace, name).set(status.desired_replicas)
        if status.predicted is not None:
            self.telemetry.predicted_ttft.labels(namespace, name).set(status.predicted.ttft_ms / 1000.0)
            self.telemetry.predicted_tpot.labels(namespace, name).set(status.predicted.tpot_ms / 1000.0)
        observed = status.observed
        if observed is not None and observed.ttft_ms is not None:
            self.telemetry.observed_ttft.labels(namespace, name).set(observed.ttft_ms / 1000.0)
        if observed is not None and observed.tpot_ms is not None:
            self.telemetry.observed_tpot.labels(namespace, name).set(observed.tpot_ms / 1000.0)

    def resync(self) -> None:
        """Reconcile every resource; with Prometheus configured, first fetch everyone's metrics in one pass.
        Never raises: the loop that calls it must outlive any failure (the liveness probe watches it)."""
        if self.cluster is None:
            return
        try:
            active = self._active_namespaces()
            bodies = [] if active == () else self.cluster.list_llmdeployments(
                self.config.namespaces if active is None else active)
            inputs = self._scaling_inputs(bodies) if self.metrics is not None and bodies else {}
        except Exception as exc:
            self._report(("", "resync"), f"resync failed: {exc}", exc)
            return
        self._report(("", "resync"), "")
        for body in bodies:
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            self.reconcile(*key, scaling=inputs.get(key))
        self.resyncs += 1
        self.last_resync_s = time.monotonic()

    def _active_namespaces(self) -> tuple[str, ...] | None:
        """Where this operator may act: None for everywhere it watches, () for nowhere (a standby).

        With peering, kopf pauses the watch handlers of a standby but not this loop: the loop applies
        kopf's own rule (`controllers.peering.is_active`) to the peering object of each scope."""
        config = self.config
        if config.peering is None or config.peer is None or self.cluster is None:
            self.role = "standalone"
            return None
        now = datetime.now(UTC)
        scopes: tuple[str | None, ...] = config.namespaces or (None,)
        active = tuple(ns for ns in scopes if is_active(
            (self.cluster.get_peering(config.peering, ns) or {}).get("status"), config.peer, now))
        self.role = "active" if active else "standby"
        if not active:
            return ()
        return None if active == (None,) else tuple(ns for ns in active if ns is not None)

    def liveness(self, now_s: float) -> dict[str, Any]:
        """The probe's report; raises StalledError when the resync loop has stalled."""
        since = now_s - self.last_resync_s
        report = {"reconciles": self.reconciles, "failures": self.failures, "writes": self.writes,
                  "resyncs": self.resyncs, "seconds_since_resync": round(since, 1), "role": self.role}
        if since > self.config.stall_limit_s:
            raise StalledError(f"the resync loop has completed no pass for {since:.0f} s "
                               f"(limit {self.config.stall_limit_s:.0f} s): {report}")
        return report

    def _seed_histories(self, keys: list[DeploymentKey]) -> None:
        """Deployments this process has no history for (a restart, a new resource) start their forecasts
        from what Prometheus kept, not from nothing: a restart in the middle of a ramp must not forget it."""
        assert self.metrics is not None
        new = [key for key in keys if (key.namespace, key.name) not in self.histories]
        if not new:
            return
        try:
            history = self.metrics.arrivals_history(new, FORECAST_HISTORY_S, BUCKET_S)
        except MetricsUnavailableError as exc:
            log.warning("reading the arrivals history failed (%s); forecasts start from now", exc)
            return  # tried again next pass
        for key in new:
            self.histories[(key.namespace, key.name)] = ScalingHistory(
                forecasts=forecasts_from(history.get(key, [])))

    def _scaling_inputs(self, bodies: list[dict[str, Any]]) -> dict[tuple[str, str], ScalingInput]:
        assert self.metrics is not None and self.cluster is not None
        now_s = time.time()
        by_quantile: dict[float, list[DeploymentKey]] = {}
        for body in bodies:
            spec = body.get("spec") or {}
            if (spec.get("scaling") or {}).get("mode", "Auto") == "Off":
                continue
            percentile = float((spec.get("slo") or {}).get("percentile", 95.0))
            by_quantile.setdefault(percentile / 100.0, []).append(
                DeploymentKey(body["metadata"]["namespace"], body["metadata"]["name"]))
        observations: dict[DeploymentKey, Observation] = {}
        prefill: dict[DeploymentKey, float] = {}
        problem = None
        try:
            for quantile, keys in by_quantile.items():  # one query per signal per distinct SLO percentile
                fetched = self.metrics.fetch(keys, quantile)
                observations.update(fetched.observations)
                prefill.update(fetched.prefill_s)
            read_at = time.monotonic()
            for key, loads in self.metrics.in_flight_by_pod([k for keys in by_quantile.values() for k in keys]).items():
                self.in_flight[(key.namespace, key.name)] = (read_at, loads)
        except MetricsUnavailableError as exc:
            problem = str(exc)
        self._report(("", "metrics"), f"metrics unavailable: {problem}" if problem else "")
        pods: list[dict[str, Any]] | None
        try:
            pods = self.cluster.list_bound_pods()
        except Exception as exc:  # e.g. namespace-scoped RBAC cannot list pods cluster-wide
            log.warning("listing pods failed (%s); free GPU capacity unknown this cycle", exc)
            pods = None
        self._seed_histories([key for keys in by_quantile.values() for key in keys])
        return {
            (key.namespace, key.name): ScalingInput(
                observation=observations.get(key), metrics_problem=problem, prefill_s=prefill.get(key),
                history=self.histories.get((key.namespace, key.name), ScalingHistory()), now_s=now_s,
                bound_pods=pods, decision_interval_s=self.config.scan_interval_s)
            for keys in by_quantile.values() for key in keys
        }


class StalledError(KvscaleError):
    """The resync loop has not completed a pass for longer than the liveness limit."""


def _owner_name(body: Mapping[str, Any]) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{API_GROUP}/"):
            return str(ref["name"])
    return None


def build_registry(config: OperatorConfig) -> tuple[kopf.OperatorRegistry, OperatorState]:
    """A fresh kopf registry with kvscale's handlers (fresh, so several operators can run in one process)."""
    registry = kopf.OperatorRegistry()
    state = OperatorState(config=config)
    resync_task: dict[str, asyncio.Task[None]] = {}

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry has none of kopf's default login handlers: authenticate the way the
        # official client does (KUBECONFIG, ~/.kube/config, or the in-cluster service account).
        use_kubeconfig(config.kubeconfig)
        info: kopf.ConnectionInfo | None = kopf.login_via_client(**kwargs)
        return info

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        settings.execution.max_workers = HANDLER_WORKERS
        settings.peering.lifetime = config.peering_lifetime_s
        # One connection per handler thread and one for the resync loop.
        state.cluster = await asyncio.to_thread(Cluster.from_kubeconfig, config.kubeconfig, HANDLER_WORKERS + 1)
        if config.prometheus_url:
            state.metrics = PrometheusSource(config.prometheus_url, window_s=config.metrics_window_s)
        if config.metrics_port is not None:
            state.telemetry.serve(config.metrics_port)

        async def resync_forever() -> None:
            state.last_resync_s = time.monotonic()
            while True:
                await asyncio.sleep(config.scan_interval_s)
                try:
                    await asyncio.to_thread(state.resync)
                except Exception:  # resync never raises; if it ever did, the loop must go on
                    log.exception("resync pass failed")

        resync_task["task"] = asyncio.create_task(resync_forever())

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        state.stopping.set()
        task = resync_task.pop("task", None)
        if task is not None:
            task.cancel()

    @kopf.on.event(API_GROUP, API_VERSION, PLURAL, registry=registry)
    def on_llmdeployment(type: str, namespace: str | None, name: str, meta: kopf.Meta, **_: Any) -> None:
        if type == "DELETED" or not namespace:
            return
        if state.is_own_write(namespace, name, meta.get("resourceVersion")):
            return  # the echo of kvscale's own status write: the pass that wrote it saw this state
        state.reconcile(namespace, name)

    @kopf.on.event("apps", "v1", "deployments", labels=MANAGED_BY, registry=registry)
    def on_owned_deployment(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        owner = _owner_name(body)
        if owner is not None and namespace:  # drift, readiness and deletion of what kvscale owns
            state.reconcile(namespace, owner)

    # Multi-node replicas (sigs.k8s.io/lws). kopf serves it once the CRD exists (it follows CRDs) and warns
    # while it does not; the resync reconciles every resource either way.
    @kopf.on.event("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", labels=MANAGED_BY, registry=registry)
    def on_owned_leader_worker_set(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        owner = _owner_name(body)
        if owner is not None and namespace:
            state.reconcile(namespace, owner)

    # Async: it runs on the event loop, never queued behind busy reconcile threads, so a loaded
    # operator still answers its probe in time.
    @kopf.on.probe(id="reconciles", registry=registry)
    async def probe_reconciles(**_: Any) -> dict[str, Any]:
        try:
            return state.liveness(time.monotonic())
        except StalledError as exc:  # a permanent error: kopf answers the probe with HTTP 500
            raise kopf.PermanentError(str(exc)) from exc

    return registry, state


def run_operator(config: OperatorConfig, liveness_endpoint: str | None) -> None:
    """Run until interrupted (the `kvscale run` command)."""
    if config.peering is not None and config.peer is None:
        # As kopf names a peer (POD_ID: the pod's name, from the chart); kopf pauses every peer that
        # shares a priority, so each process draws its own (the highest is active).
        identity = os.environ.get("POD_ID") or f"{getpass.getuser()}@{socket.gethostname()}/{os.getpid()}"
        config = replace(config, peer=PeerIdentity(identity=identity, priority=secrets.randbelow(2**31 - 1) + 1))
    registry, _ = build_registry(config)
    kopf.run(
        registry=registry,
        standalone=config.peering is None,
        peering_name=config.peering,
        identity=cast(Any, config.peer.identity) if config.peer else None,  # kopf's Identity: a str NewType
        priority=config.peer.priority if config.peer else 0,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        liveness_endpoint=liveness_endpoint,
    )

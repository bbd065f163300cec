"""The Kubernetes edge: reads and writes through the official client, as plain dicts.

Everything the operator does to the cluster goes through `Cluster`; its errors are kvscale's own
(`KubeApiError`), with the HTTP status kept so callers can tell "not found" and "conflict" apart.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from kubernetes import config, dynamic
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.config import kube_config
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError, ResourceNotFoundError
from urllib3.exceptions import HTTPError

from kvscale.api.conditions import format_time
from kvscale.api.spec import API_GROUP, API_VERSION, KIND
from kvscale.errors import KvscaleError
from kvscale.kube.leaderworkerset import LWS_API_VERSION, LWS_KIND

PLURAL = "llmdeployments"
MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "kvscale"
# Every call gets a deadline: a hung API server (etcd gone, say) must fail a pass, not stall it forever.
REQUEST_TIMEOUT_S = 30.0
NODES_MAX_AGE_S = 5.0
# Where the LeaderWorkerSet API is absent (most clusters), discovery is asked again at most this often:
# every reconcile pass reads it, and a discovery round lists every API group.
API_ABSENT_RECHECK_S = 60.0
DEFAULT_CONNECTIONS = 10  # the official client's default pool: 5 per CPU here
T = TypeVar("T")


def _as_dict(_client: Any, data: Any) -> Any:
    """The dynamic client's response serializer, replaced: plain JSON dicts instead of its
    attribute-wrapped ResourceInstance (and its slow to_dict), since kvscale works on dicts."""
    return data


def use_kubeconfig(path: str | None) -> None:
    """Make `path` the official client's default kubeconfig (also for kopf's client-based login).

    The client reads $KUBECONFIG once, when it is first imported, which is before a command line
    flag can be applied.
    """
    if path:
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = path


class KubeApiError(KvscaleError):
    """A Kubernetes API call failed; `status` is the HTTP status (0 when there was no response)."""

    def __init__(self, message: str, status: int = 0, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail or message  # the API server's own message, without what kvscale was doing

    @property
    def conflict(self) -> bool:
        return self.status == 409


def _wrap(what: str, exc: Exception) -> KubeApiError:
    status = int(getattr(exc, "status", 0) or 0)
    message = getattr(exc, "reason", "") or str(exc)
    with contextlib.suppress(TypeError, ValueError, AttributeError):  # the body is not always JSON
        message = json.loads(getattr(exc, "body", "") or "").get("message", message)
    return KubeApiError(f"{what}: {status} {message}", status, f"{status} {message}")


# OSError: refused, TLS, DNS; urllib3's errors (timeouts, protocol) are neither of the others.
_TRANSPORT_ERRORS = (ApiException, DynamicApiError, OSError, HTTPError)


def _call(what: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except _TRANSPORT_ERRORS as exc:
        raise _wrap(what, exc) from exc


@dataclass(frozen=True)
class EventRecord:
    """A Kubernetes Event about an LLMDeployment."""

    type: str  # Normal or Warning
    reason: str  # CamelCase, from the catalogue in kvscale.controllers.events
    message: str


class Cluster:
    """Typed access to the objects kvscale reads and writes."""

    def __init__(self, api_client: ApiClient) -> None:
        self._dynamic = dynamic.DynamicClient(api_client)
        self._deployments = self._dynamic.resources.get(api_version="apps/v1", kind="Deployment")
        self._services = self._dynamic.resources.get(api_version="v1", kind="Service")
        self._nodes = self._dynamic.resources.get(api_version="v1", kind="Node")
        self._pods = self._dynamic.resources.get(api_version="v1", kind="Pod")
        self._config_maps = self._dynamic.resources.get(api_version="v1", kind="ConfigMap")
        self._events = self._dynamic.resources.get(api_version="v1", kind="Event")
        self._llmds = self._dynamic.resources.get(api_version=f"{API_GROUP}/{API_VERSION}", kind=KIND)
        self._leader_worker_sets: Any = None  # discovered on first use: the CRD may come later
        self._leader_worker_sets_missing_at: float | None = None  # monotonic time of the last miss
        self._nodes_read: tuple[float, list[dict[str, Any]]] | None = None
        self._nodes_lock = threading.Lock()

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, connections: int = DEFAULT_CONNECTIONS) -> Cluster:
        """A client from a kubeconfig file, or the in-cluster service account when none is given.

        `connections`: the HTTP connections kept open to the API server; at least as many as the threads
        that call it at once, or each burst discards and re-opens TLS connections.
        """
        configuration = Configuration()
        configuration.connection_pool_maxsize = connections
        try:
            if path is None:
                try:
                    config.load_incluster_config(client_configuration=configuration)
                    return cls(ApiClient(configuration))
                except config.ConfigException:
                    pass
            config.load_kube_config(config_file=path, client_configuration=configuration, persist_config=False)
            return cls(ApiClient(configuration))
        except (config.ConfigException, OSError) as exc:
            raise KubeApiError(f"cannot load Kubernetes credentials: {exc}") from exc

    # --- reads -------------------------------------------------------------------------------
    def _get(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = resource.get(name=name, namespace=namespace, serializer=_as_dict,
                                                 _request_timeout=REQUEST_TIMEOUT_S)
        except NotFoundError:
            return None
        except _TRANSPORT_ERRORS as exc:
            raise _wrap(f"get {resource.kind} {namespace}/{name}", exc) from exc
        return found

    def _list(self, what: str, resource: Any, **params: Any) -> list[dict[str, Any]]:
        found = _call(what, lambda: resource.get(serializer=_as_dict, _request_timeout=REQUEST_TIMEOUT_S, **params))
        items: list[dict[str, Any]] = found.get("items") or []
        return items

    def get_llmdeployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._llmds, namespace, name)

    def list_llmdeployments(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        if not namespaces:
            return self._list("list LLMDeployments", self._llmds)
        items: list[dict[str, Any]] = []
        for ns in namespaces:
            items += self._list(f"list LLMDeployments in {ns}", self._llmds, namespace=ns)
        return items

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._deployments, namespace, name)

    def list_deployments(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """The Deployments in `namespace` whose labels match `selector`."""
        labels = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        return self._list(f"list deployments {labels} in {namespace}", self._deployments, namespace=namespace,
                          label_selector=labels)

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._services, namespace, name)

    def leader_worker_sets(self) -> Any | None:
        """The LeaderWorkerSet resource (sigs.k8s.io/lws), or None while the API server does not serve it."""
        if self._leader_worker_sets is None:
            missed = self._leader_worker_sets_missing_at
            if missed is not None and time.monotonic() - missed < API_ABSENT_RECHECK_S:
                return None
            try:
                self._leader_worker_sets = self._dynamic.resources.get(api_version=LWS_API_VERSION, kind=LWS_KIND)
            except ResourceNotFoundError:
                self._leader_worker_sets_missing_at = time.monotonic()
                with contextlib.suppress(Exception):  # discovery is cached: the next look must ask again
                    self._dynamic.resources.invalidate_cache()
                return None
            except _TRANSPORT_ERRORS as exc:
                raise _wrap("discover LeaderWorkerSet", exc) from exc
        return self._leader_worker_sets

    def get_leader_worker_set(self, namespace: str, name: str) -> dict[str, Any] | None:
        resource = self.leader_worker_sets()
        return None if resource is None else self._get(resource, namespace, name)

    def delete_owned(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete an object kvscale owns, only if it is still the one read (uid precondition); its pods go
        with it (background propagation). Already gone is success."""
        resource = self._resource_for({"kind": kind})
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                "preconditions": {"uid": uid}}
        try:
            resource.delete(name=name, namespace=namespace, body=body, _request_timeout=REQUEST_TIMEOUT_S)
        except NotFoundError:
            return
        except _TRANSPORT_ERRORS as exc:
            raise _wrap(f"delete {kind} {namespace}/{name}", exc) from exc

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._config_maps, namespace, name)

    def list_nodes(self) -> list[dict[str, Any]]:
        """The nodes, read at most every NODES_MAX_AGE_S: every reconcile counts capacity, and nodes
        change far less often than a burst of resources is reconciled."""
        with self._nodes_lock:
            now_s = time.monotonic()
            if self._nodes_read is None or now_s - self._nodes_read[0] > NODES_MAX_AGE_S:
                self._nodes_read = (now_s, self._list("list nodes", self._nodes))
            return self._nodes_read[1]

    def get_peering(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        """kopf's peering object (a KopfPeering in `namespace`, or the ClusterKopfPeering when None);
        None when it or its CRD does not exist."""
        kind = "ClusterKopfPeering" if namespace is None else "KopfPeering"
        try:
            resource = self._dynamic.resources.get(api_version="kopf.dev/v1", kind=kind)
        except ResourceNotFoundError:
            return None
        return self._get(resource, namespace, name)

    def list_bound_pods(self) -> list[dict[str, Any]]:
        """Every pod bound to a node and not finished, in all namespaces (for free-GPU counting)."""
        return self._list("list pods", self._pods,
                          field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed")

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """The pods in `namespace` whose labels match `selector`."""
        labels = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        return self._list(f"list pods {labels} in {namespace}", self._pods, namespace=namespace, label_selector=labels)

    # --- writes ------------------------------------------------------------------------------
    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """A merge patch of a pod's annotations (the ReplicaSet's pod-deletion-cost, say)."""
        body = {"metadata": {"annotations": dict(annotations)}}
        _call(f"annotate pod {namespace}/{name}",
              lambda: self._pods.patch(body=body, name=name, namespace=namespace, content_type=MERGE_PATCH,
                                       field_manager=FIELD_MANAGER, serializer=_as_dict,
                                       _request_timeout=REQUEST_TIMEOUT_S))

    def apply(self, body: Mapping[str, Any], force: bool = False) -> dict[str, Any]:
        """Server-side apply of the whole object under the `kvscale` field manager: kvscale owns the
        fields it sets, a field it stops setting is removed, and (without `force`) a field another
        manager changed since is a 409 conflict naming that manager instead of a silent overwrite."""
        resource = self._resource_for(body)
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        applied: dict[str, Any] = _call(
            f"apply {body['kind']} {namespace}/{name}",
            lambda: resource.server_side_apply(body=dict(body), name=name, namespace=namespace,
                                               field_manager=FIELD_MANAGER, force_conflicts=force,
                                               serializer=_as_dict, _request_timeout=REQUEST_TIMEOUT_S))
        return applied

    def patch_llmdeployment_status(self, namespace: str, name: str, status: Mapping[str, Any],
                                   resource_version: str | None = None) -> dict[str, Any]:
        """A merge patch of the status subresource. Fields sent as null are removed. With
        `resource_version`, the write is refused (409) if the resource changed since it was read."""
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        patched: dict[str, Any] = _call(
            f"patch status of {KIND} {namespace}/{name}",
            lambda: self._llmds.status.patch(body=body, name=name, namespace=namespace, content_type=MERGE_PATCH,
                                             field_manager=FIELD_MANAGER, serializer=_as_dict,
                                             _request_timeout=REQUEST_TIMEOUT_S))
        return patched

    def emit_event(self, owner: Mapping[str, Any], event: EventRecord, now: datetime) -> None:
        meta = owner["metadata"]
        stamp = format_time(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": "kvscale"},
            "reportingComponent": "kvscale.dev/operator",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        _call(f"create Event {event.reason}",
              lambda: self._events.create(body=body, namespace=meta["namespace"], serializer=_as_dict,
                                          _request_timeout=REQUEST_TIMEOUT_S))

    def _resource_for(self, body: Mapping[str, Any]) -> Any:
        kinds = {"Deployment": self._deployments, "Service": self._services, "Event": self._events}
        if body.get("kind") == LWS_KIND:
            resource = self.leader_worker_sets()
            if resource is None:
                raise KubeApiError("the API server does not serve leaderworkersets.leaderworkerset.x-k8s.io "
                                   "(LeaderWorkerSet is not installed)", status=404,
                                   detail="LeaderWorkerSet is not installed")
            return resource
        try:
            return kinds[body["kind"]]
        except KeyError as exc:
            raise KvscaleError(f"kvscale does not write {body.get('kind')!r} objects") from exc

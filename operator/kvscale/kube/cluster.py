"""The Kubernetes edge: reads and writes through the official client, as plain dicts.

Everything the operator does to the cluster goes through `Cluster`; its errors are kvscale's own
(`KubeApiError`), with the HTTP status kept so callers can tell "not found" and "conflict" apart.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from kubernetes import config, dynamic
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.config import kube_config
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError

from kvscale.api.conditions import format_time
from kvscale.api.spec import API_GROUP, API_VERSION, KIND
from kvscale.errors import KvscaleError

PLURAL = "llmdeployments"
MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "kvscale"
T = TypeVar("T")


def use_kubeconfig(path: str | None) -> None:
    """Make `path` the official client's default kubeconfig (also for kopf's client-based login).

    The client reads $KUBECONFIG once, when it is first imported, which is before a command line
    flag can be applied.
    """
    if path:
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = path


class KubeApiError(KvscaleError):
    """A Kubernetes API call failed; `status` is the HTTP status (0 when there was no response)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _wrap(what: str, exc: Exception) -> KubeApiError:
    status = int(getattr(exc, "status", 0) or 0)
    message = getattr(exc, "reason", "") or str(exc)
    with contextlib.suppress(TypeError, ValueError, AttributeError):  # the body is not always JSON
        message = json.loads(getattr(exc, "body", "") or "").get("message", message)
    return KubeApiError(f"{what}: {status} {message}", status)


def _call(what: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except (ApiException, DynamicApiError, OSError) as exc:  # OSError: refused, TLS, DNS
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

    @classmethod
    def from_kubeconfig(cls, path: str | None = None) -> Cluster:
        """A client from a kubeconfig file, or the in-cluster service account when none is given."""
        try:
            if path is None:
                try:
                    config.load_incluster_config()
                    return cls(ApiClient())
                except config.ConfigException:
                    pass
            return cls(config.new_client_from_config(config_file=path))
        except (config.ConfigException, OSError) as exc:
            raise KubeApiError(f"cannot load Kubernetes credentials: {exc}") from exc

    # --- reads -------------------------------------------------------------------------------
    def _get(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            found = resource.get(name=name, namespace=namespace)
        except NotFoundError:
            return None
        except (ApiException, DynamicApiError, OSError) as exc:
            raise _wrap(f"get {resource.kind} {namespace}/{name}", exc) from exc
        result: dict[str, Any] = found.to_dict()
        return result

    def get_llmdeployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._llmds, namespace, name)

    def list_llmdeployments(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        if not namespaces:
            return [i.to_dict() for i in _call("list LLMDeployments", lambda: self._llmds.get()).items]
        items: list[dict[str, Any]] = []
        for ns in namespaces:
            try:
                found = self._llmds.get(namespace=ns)
            except (ApiException, DynamicApiError, OSError) as exc:
                raise _wrap(f"list LLMDeployments in {ns}", exc) from exc
            items += [i.to_dict() for i in found.items]
        return items

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._deployments, namespace, name)

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._services, namespace, name)

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._config_maps, namespace, name)

    def list_nodes(self) -> list[dict[str, Any]]:
        return [n.to_dict() for n in _call("list nodes", lambda: self._nodes.get()).items]

    def list_bound_pods(self) -> list[dict[str, Any]]:
        """Every pod bound to a node and not finished, in all namespaces (for free-GPU counting)."""
        result = _call("list pods", lambda: self._pods.get(field_selector="spec.nodeName!=,status.phase!=Succeeded,"
                                                                          "status.phase!=Failed"))
        return [p.to_dict() for p in result.items]

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        result = _call(f"list pods {label_selector}",
                       lambda: self._pods.get(namespace=namespace, label_selector=label_selector))
        return [p.to_dict() for p in result.items]

    # --- writes ------------------------------------------------------------------------------
    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        resource = self._resource_for(body)
        namespace = body["metadata"]["namespace"]
        created = _call(f"create {body['kind']} {namespace}/{body['metadata']['name']}",
                        lambda: resource.create(body=dict(body), namespace=namespace, field_manager=FIELD_MANAGER))
        result: dict[str, Any] = created.to_dict()
        return result

    def merge_patch(self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        resource = self._resource_for({"kind": kind})
        patched = _call(f"patch {kind} {namespace}/{name}",
                        lambda: resource.patch(body=dict(patch), name=name, namespace=namespace,
                                               content_type=MERGE_PATCH, field_manager=FIELD_MANAGER))
        result: dict[str, Any] = patched.to_dict()
        return result

    def patch_llmdeployment_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        _call(f"patch status of {KIND} {namespace}/{name}",
              lambda: self._llmds.status.patch(body={"status": dict(status)}, name=name, namespace=namespace,
                                               content_type=MERGE_PATCH, field_manager=FIELD_MANAGER))

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
        _call(f"create Event {event.reason}", lambda: self._events.create(body=body, namespace=meta["namespace"]))

    def _resource_for(self, body: Mapping[str, Any]) -> Any:
        kinds = {"Deployment": self._deployments, "Service": self._services, "Event": self._events}
        try:
            return kinds[body["kind"]]
        except KeyError as exc:
            raise KvscaleError(f"kvscale does not write {body.get('kind')!r} objects") from exc

"""Helpers for the Helm chart's bed tests: helm releases, ServiceAccount credentials, and the operator
run in-process with exactly the chart's RBAC (a real ServiceAccount token, as the pod would have).

The bed is shared with other test sessions: every release, namespace and cluster-scoped object made
here has a unique name and is removed afterwards; CRDs are never deleted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import subprocess
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import yaml
from bedkit import BIN_DIR, Kube, free_port, wait_until
from kubernetes.config import kube_config
from operator_harness import apply_cluster_objects

from kvscale.controllers.operator import OperatorConfig, OperatorState, build_registry
from kvscale.controllers.peering import PeerIdentity

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "helm" / "kvscale"
PEERING_CRDS = CHART / "crds" / "kopf-peerings.yaml"


def helm_binary() -> str | None:
    return shutil.which("helm", path=str(BIN_DIR)) or shutil.which("helm")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def set_args(values: dict[str, str] | None = None, json_values: dict[str, Any] | None = None) -> list[str]:
    args: list[str] = []
    for key, value in (values or {}).items():
        args += ["--set", f"{key}={value}"]
    for key, jvalue in (json_values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(jvalue)}"]
    return args


@dataclass
class Helm:
    """helm against the bed (its kubeconfig), never raising on a non-zero exit unless check=True."""

    kube: Kube
    binary: str

    def __call__(self, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, f"--kubeconfig={self.kube.kubeconfig}", *args],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "HELM_CACHE_HOME": str(REPO_ROOT / ".testbed" / "helm" / "cache"),
                 "HELM_CONFIG_HOME": str(REPO_ROOT / ".testbed" / "helm" / "config"),
                 "HELM_DATA_HOME": str(REPO_ROOT / ".testbed" / "helm" / "data")},
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def template(self, release: str, namespace: str, *extra: str) -> str:
        return self("template", release, str(CHART), "--namespace", namespace, *extra, check=True).stdout

    @contextmanager
    def release(self, release: str, namespace: str, *extra: str) -> Iterator[Release]:
        """`helm install --skip-crds` (the CRDs are shared on the bed); `helm uninstall` afterwards."""
        self("install", release, str(CHART), "--namespace", namespace, "--skip-crds", *extra, check=True)
        try:
            yield Release(self, release, namespace)
        finally:
            self("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s")


@dataclass
class Release:
    helm: Helm
    name: str
    namespace: str

    @property
    def fullname(self) -> str:
        return self.name if "kvscale" in self.name else f"{self.name}-kvscale"

    @property
    def cluster_name(self) -> str:
        """The name of the release's ClusterRole and ClusterRoleBinding."""
        return f"{self.namespace}-{self.fullname}"

    @property
    def service_account(self) -> str:
        return self.fullname

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def manifest(self) -> list[dict[str, Any]]:
        text = self.helm("get", "manifest", self.name, "--namespace", self.namespace, check=True).stdout
        return [doc for doc in yaml.safe_load_all(text) if doc]


def apply_peering_crds(kube: Kube) -> None:
    """kopf's peering CRDs from the chart (idempotent; shared cluster-scoped objects, never deleted)."""
    apply_cluster_objects(kube, PEERING_CRDS)
    for crd in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        kube.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s", check=True)


def can_i(kube: Kube, user: str, verb: str, resource: str, namespace: str | None = None) -> bool:
    """`kubectl auth can-i` as `user` (impersonated by the bed's admin); None namespace: cluster-wide."""
    scope = ["--all-namespaces"] if namespace is None else ["-n", namespace]
    result = kube.kubectl("auth", "can-i", verb, resource, *scope, f"--as={user}")
    answer = result.stdout.strip()
    if answer not in ("yes", "no"):
        raise AssertionError(f"kubectl auth can-i {verb} {resource}: {result.stdout} {result.stderr}")
    allowed: bool = answer == "yes"
    return allowed


def write_token_kubeconfig(kube: Kube, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig holding a real token of the ServiceAccount (`kubectl create token`): the credential
    the operator pod would get, so the API server applies exactly the chart's RBAC."""
    token = kube.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h",
                         check=True).stdout.strip()
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    user = f"{namespace}-{service_account}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user, "namespace": namespace}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({record.exc_info[1]!r})"
        self.messages.append(f"{record.name}: {text}")


@dataclass
class ScopedOperator:
    """The kvscale operator running in-process under a ServiceAccount's token."""

    state: OperatorState
    health_url: str
    metrics_url: str | None
    reconciled: dict[tuple[str, str], int] = field(default_factory=dict)
    records: _Records = field(default_factory=_Records)

    def forbidden(self) -> list[str]:
        """Warnings and errors the operator logged about missing permissions (should be none)."""
        words = ("403", "forbidden", "permission")
        return [m for m in self.records.messages if any(w in m.lower() for w in words)]


@contextmanager
def running_operator_as(
    kubeconfig: Path,
    *,
    namespaces: Sequence[str] = (),
    act_in: Sequence[str],
    peering: str | None = None,
    scan_interval_s: float = 2.0,
    metrics: bool = False,
) -> Iterator[ScopedOperator]:
    """kvscale's own kopf registry with the credentials in `kubeconfig`.

    `namespaces` empty: cluster-wide, like the chart's default (kopf watches and resyncs list every
    namespace), but reconciles act only in `act_in`, so this operator never writes to other tests'
    resources on the shared bed. `peering`: join that kopf peering with a random priority (the
    pods of a release with replicaCount > 1 do the same), instead of running standalone.
    """
    # As `kvscale run` does: a peer identity and a priority of its own, for kopf and for the resync loop.
    peer = PeerIdentity(identity=f"test-{uuid.uuid4().hex[:8]}", priority=random.randint(1, 1_000_000))
    config = OperatorConfig(namespaces=tuple(namespaces), scan_interval_s=scan_interval_s,
                            kubeconfig=str(kubeconfig), peering=peering, peer=peer if peering else None,
                            metrics_port=free_port() if metrics else None)
    registry, state = build_registry(config)
    allowed = set(act_in)
    running = ScopedOperator(state=state, health_url=f"http://127.0.0.1:{free_port()}/healthz",
                             metrics_url=f"http://127.0.0.1:{config.metrics_port}/metrics" if metrics else None)
    real_reconcile: Callable[..., Any] = state.reconcile

    def reconcile_here_only(namespace: str, name: str, *args: Any, **kwargs: Any) -> Any:
        if namespace not in allowed:
            return None
        outcome = real_reconcile(namespace, name, *args, **kwargs)
        if outcome is not None:
            running.reconciled[(namespace, name)] = running.reconciled.get((namespace, name), 0) + 1
        return outcome

    state.reconcile = reconcile_here_only  # type: ignore[method-assign]  # the handlers call it
    root = logging.getLogger()
    root.addHandler(running.records)
    # kopf's login handler (kopf.login_via_client) calls kubernetes.config.load_kube_config(), which
    # reads KUBE_CONFIG_DEFAULT_LOCATION: $KUBECONFIG as it was when kubernetes was first imported.
    previous_kubeconfig = os.environ.get("KUBECONFIG")
    previous_default = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    os.environ["KUBECONFIG"] = str(kubeconfig)
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(kubeconfig)
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(kopf.operator(
                registry=registry,
                standalone=peering is None,
                peering_name=peering,
                identity=peer.identity if peering else None,  # type: ignore[arg-type]  # kopf's str NewType
                priority=peer.priority if peering else None,
                clusterwide=not namespaces,
                namespaces=list(namespaces),
                liveness_endpoint=running.health_url.replace("127.0.0.1", "0.0.0.0"),
                stop_flag=stop,
                ready_flag=ready,
            ))
        except BaseException as exc:  # reported to the test instead of dying silently in the thread
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=serve, name="kvscale-operator-as-sa", daemon=True)
    thread.start()
    try:
        assert ready.wait(60), "operator did not become ready in 60 s"
        assert not failure, f"operator failed to start: {failure[0]!r}"
        wait_until(lambda: state.cluster is not None, 30, "operator startup")
        yield running
    finally:
        stop.set()
        thread.join(30)
        root.removeHandler(running.records)
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = previous_default
        if previous_kubeconfig is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous_kubeconfig


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode()

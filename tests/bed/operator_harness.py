"""Run the kvscale operator in-process (a kopf operator in a thread) against the bed, and read objects."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
from bedkit import STATE_DIR, Kube, free_port, wait_until

from kvscale.api.spec import load_resource
from kvscale.controllers.operator import OperatorConfig, OperatorState, build_registry
from kvscale.planner import build_plan_inputs, plan_deployment

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD = REPO_ROOT / "crds" / "llmdeployments.kvscale.dev.yaml"


def _nodes_per_replica(example: Path) -> int:
    chosen = plan_deployment(build_plan_inputs(load_resource(example).spec)).chosen
    return chosen.nodes_per_replica if chosen is not None else 1


# The shipped examples: those whose replicas fit one node run as Deployments; those that span nodes (pipeline
# stages, or data-parallel engines filling whole nodes) as LeaderWorkerSets (docs/multinode.md).
ALL_EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))
EXAMPLES = [p for p in ALL_EXAMPLES if _nodes_per_replica(p) == 1]
MULTI_NODE_EXAMPLES = [p for p in ALL_EXAMPLES if _nodes_per_replica(p) > 1]


@dataclass
class RunningOperator:
    state: OperatorState
    stop: threading.Event
    thread: threading.Thread


class OperatorProcess:
    """`kvscale run` as users run it: a process of its own, watching one namespace, with its probe.

    `peering`: join that kopf peering (as the chart's pods do with replicaCount > 1), as `pod_id`."""

    def __init__(self, namespace: str, scan_interval_s: float = 2.0, prometheus_url: str | None = None,
                 peering: str | None = None, peering_lifetime_s: int | None = None, pod_id: str | None = None) -> None:
        self.namespace = namespace
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"
        self.pod_id = pod_id or f"operator-{uuid.uuid4().hex[:6]}"
        self.log = STATE_DIR / "logs" / f"{self.pod_id}-{namespace}.log"
        self.args = ["--scan-interval", str(scan_interval_s), "--liveness", self.liveness,
                     "--log-format", "plain", "--log-level", "info"]
        if prometheus_url:
            self.args += ["--prometheus-url", prometheus_url]
        if peering:
            self.args += ["--peering", peering]
        if peering_lifetime_s:
            self.args += ["--peering-lifetime", str(peering_lifetime_s)]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(STATE_DIR / "kubeconfig"), "POD_ID": self.pod_id}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [str(REPO_ROOT / ".venv" / "bin" / "kvscale"), "run", "-n", self.namespace, *self.args],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_until(self.report, 60, "the operator's liveness endpoint")

    def report(self) -> dict[str, Any]:
        """The probe's report (kopf keeps each answer for 10 s)."""
        import urllib.request

        with urllib.request.urlopen(self.liveness, timeout=5) as resp:
            found: dict[str, Any] = json.loads(resp.read())["reconciles"]
            return found

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def apply_cluster_objects(kube: Kube, path: Path) -> None:
    """`kubectl apply -f path`, retried: tests in two lanes (tests/testbed/run-bed-tests.sh) can both find a
    cluster-scoped object missing and both create it; the second create fails AlreadyExists, its retry patches."""
    def applied() -> bool:
        result = kube.kubectl("apply", "-f", str(path))
        assert result.returncode == 0, result.stderr  # reported if every try fails
        return True

    wait_until(applied, 60, f"kubectl apply -f {path}")


def install_crd(kube: Kube) -> None:
    apply_cluster_objects(kube, CRD)
    # On a bed that has just come up, `kubectl wait` can fail at once (its discovery of the
    # CustomResourceDefinition type races the apiserver's first seconds): a failed wait is "not yet".
    wait_until(lambda: kube.kubectl("wait", "--for=condition=Established", "crd/llmdeployments.kvscale.dev",
                                    "--timeout=10s").returncode == 0, 60, "the LLMDeployment CRD Established")


@contextmanager
def running_operator(kube: Kube, scan_interval_s: float = 2.0, namespaces: tuple[str, ...] = (),
                     prometheus_url: str | None = None, liveness_endpoint: str | None = None,
                     liveness_stall_s: float | None = None) -> Iterator[RunningOperator]:
    from kubernetes.config import kube_config

    os.environ["KUBECONFIG"] = str(kube.kubeconfig)  # kopf's own login reads it
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(kube.kubeconfig)  # read at import time otherwise
    options: dict[str, Any] = {} if liveness_stall_s is None else {"liveness_stall_s": liveness_stall_s}
    registry, state = build_registry(OperatorConfig(namespaces=namespaces, scan_interval_s=scan_interval_s,
                                                    kubeconfig=str(kube.kubeconfig),
                                                    prometheus_url=prometheus_url, **options))
    stop, ready = threading.Event(), threading.Event()

    def serve() -> None:
        asyncio.run(kopf.operator(registry=registry, standalone=True, clusterwide=not namespaces,
                                  namespaces=list(namespaces), stop_flag=stop, ready_flag=ready,
                                  liveness_endpoint=liveness_endpoint))

    thread = threading.Thread(target=serve, name="kvscale-operator", daemon=True)
    thread.start()
    assert ready.wait(60), "operator did not become ready in 60 s"
    wait_until(lambda: state.cluster is not None, 30, "operator startup")
    try:
        yield RunningOperator(state=state, stop=stop, thread=thread)
    finally:
        stop.set()
        thread.join(30)


def apply(kube: Kube, namespace: str, document: Mapping[str, Any] | str) -> None:
    """`kubectl apply` of one resource (a dict or YAML text) into `namespace`."""
    import yaml

    text = document if isinstance(document, str) else yaml.safe_dump(dict(document))
    result = kube.kubectl("apply", "-n", namespace, "-f", "-", input=text)
    assert result.returncode == 0, result.stderr


def apply_quota(kube: Kube, namespace: str, name: str, hard: Mapping[str, str]) -> None:
    """A ResourceQuota in `namespace`, awaited until the quota controller has counted it: the API
    server enforces a quota only once its status is written."""
    apply(kube, namespace, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name},
                            "spec": {"hard": dict(hard)}})
    wait_until(lambda: ((get(kube, "resourcequota", namespace, name) or {}).get("status") or {}).get("hard"),
               60, f"the status of quota {name} (the quota controller)")


def resource_versions(kube: Kube, namespace: str, names: list[str]) -> dict[str, str]:
    """resourceVersion of each resource, its Deployment and its Service."""
    found = {}
    for name in names:
        for kind in ("llmd", "deployment", "service"):
            obj = get(kube, kind, namespace, name)
            assert obj is not None, f"{kind}/{name}"
            found[f"{kind}/{name}"] = obj["metadata"]["resourceVersion"]
    return found


def wait_quiet(kube: Kube, namespace: str, names: list[str], passes: Callable[[], int],
               timeout: float = 240) -> dict[str, str]:
    """Wait until three resync passes (`passes()` counts them) change no resourceVersion of the
    resources, their Deployments and Services (the operator writes nothing); return the versions."""
    def quiet() -> dict[str, str] | None:
        before, start = resource_versions(kube, namespace, names), passes()
        wait_until(lambda: passes() >= start + 3, 120, "three resync passes")
        return before if resource_versions(kube, namespace, names) == before else None

    found: dict[str, str] = wait_until(quiet, timeout, "three resync passes that write nothing", interval=0)
    return found


def get(kube: Kube, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    result = kube.kubectl("get", kind, name, "-n", namespace, "-o", "json")
    if result.returncode != 0:
        if "NotFound" in result.stderr:
            return None
        raise AssertionError(f"kubectl get {kind} {name}: {result.stderr}")
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return dict(item)
    return None


def required_condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The `type_` condition of `obj`, which must have it (inside `wait_until`, its absence is "not yet")."""
    found = condition(obj, type_)
    if found is None:
        name = ((obj or {}).get("metadata") or {}).get("name")
        raise AssertionError(f"no {type_} condition on {name!r} yet")
    return found


def wait_condition(kube: Kube, namespace: str, name: str, type_: str, status: str, timeout: float = 60,
                   ) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = get(kube, "llmd", namespace, name)
        found = condition(obj, type_)
        return obj if found and found["status"] == status else None

    obj: dict[str, Any] = wait_until(check, timeout, f"{namespace}/{name} condition {type_}={status}")
    return obj


def events(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    result = kube.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={name},involvedObject.kind=LLMDeployment", "-o", "json", check=True)
    items: list[dict[str, Any]] = json.loads(result.stdout)["items"]
    return items


def wait_for_event(kube: Kube, namespace: str, name: str, reason: str, timeout_s: float = 30.0) -> None:
    """Until an Event of `reason` names the resource: kvscale emits it after the write it reports, so a test
    that has seen the write may still be before the Event."""
    wait_until(lambda: reason in {e["reason"] for e in events(kube, namespace, name)}, timeout_s,
               f"a {reason} event for {name}")


def container_args(deployment: dict[str, Any]) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def load_document(path: Path, name: str | None = None, changes: Mapping[str, Any] | None = None,
                  **spec_changes: Any) -> dict[str, Any]:
    """A resource YAML as a dict, renamed and with dotted spec fields changed (`scaling.mode="Recommend"`, or
    `changes={"slo.tpotMs": 20}` for the dotted names that are no keywords)."""
    import yaml

    document: dict[str, Any] = yaml.safe_load(path.read_text())
    if name is not None:
        document["metadata"]["name"] = name
    for dotted, value in {**(changes or {}), **spec_changes}.items():
        node = document["spec"]
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return document


def wait_nodes_free(kube: Kube, product: str, timeout: float = 120) -> None:
    """Wait until no pod (of any namespace: earlier tests' namespaces are deleted in the background) is
    bound to a node labelled nvidia.com/gpu.product=`product`: tests that need every such node (whole
    multi-node groups) start from a free cluster, not from what the previous test left terminating."""
    def free() -> bool:
        nodes = json.loads(kube.kubectl("get", "nodes", "-l", f"nvidia.com/gpu.product={product}", "-o", "json",
                                        check=True).stdout)["items"]
        names = {n["metadata"]["name"] for n in nodes}
        pods = json.loads(kube.kubectl("get", "pods", "-A", "-o", "json", check=True).stdout)["items"]
        return not [p for p in pods if (p.get("spec") or {}).get("nodeName") in names
                    and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    wait_until(free, timeout, f"no pod left on the {product} nodes")

"""The Helm chart rendered by the real helm binary (`helm template` and `helm lint`; no cluster needed).

They run with the bed tests because helm comes from the bed's build (`make testbed-build`), which
`make test` runs before them; under KVSCALE_BED=1 or CI=true a missing helm is a failure, never a skip.
File-only checks of the chart stay in tests/unit/test_helm_chart.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from bedkit import BIN_DIR, bed_required

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kvscale"


# --- rendering (helm template; no cluster) -------------------------------------------------------------

@pytest.fixture(scope="module")
def helm() -> str:
    binary = shutil.which("helm", path=str(BIN_DIR)) or shutil.which("helm")
    if binary is None:
        if bed_required():
            pytest.fail(f"no helm in {BIN_DIR} or on PATH (KVSCALE_BED=1 or CI=true)", pytrace=False)
        pytest.skip(f"no helm in {BIN_DIR} or on PATH; run `make testbed-build`")
    return binary


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60)


def render(helm: str, *sets: str, release: str = "kvscale", namespace: str = "ops") -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return c


def rules_of(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in doc["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


NAMESPACED_RULES = {
    *{("kvscale.dev", "llmdeployments", v) for v in ("get", "list", "watch", "patch")},
    *{("kvscale.dev", "llmdeployments/status", v) for v in ("get", "patch", "update")},
    *{("apps", "deployments", v) for v in ("get", "list", "watch", "create", "patch", "update", "delete")},
    *{("leaderworkerset.x-k8s.io", "leaderworkersets", v)
      for v in ("get", "list", "watch", "create", "patch", "update", "delete")},
    *{("", "services", v) for v in ("get", "create", "patch")},
    ("", "configmaps", "get"),
    *{("", "pods", v) for v in ("get", "list", "watch", "patch")},
    *{(g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")},
}
CLUSTER_RULES = {
    *{("", "nodes", v) for v in ("get", "list", "watch")},
    *{("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")},
}


def test_default_values_lint_strict(helm: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("setting", "message"), [
    ("replicaCount=-1", "at '/replicaCount': minimum: got -1, want 0"),
    ("logLevel=verbose", "at '/logLevel': value must be one of 'debug', 'info', 'warning', 'error'"),
    ("logFormat=xml", "at '/logFormat': value must be one of"),
    ("scanInterval=0", "at '/scanInterval'"),
    ("scanInterval=-5", "at '/scanInterval'"),
    ("scanInterval=soon", "at '/scanInterval'"),
    ("replicas=2", "additional properties 'replicas' not allowed"),
    ("image.name=x", "at '/image': additional properties 'name' not allowed"),
    ("watchNamespaces={Team_A}", "at '/watchNamespaces/0'"),
    ("gpuPrices.H100=2", "invalid propertyName 'H100'"),
    ("gpuPrices.L4=-1", "at '/gpuPrices/L4'"),
    ("prometheusUrl=prometheus:9090", "at '/prometheusUrl'"),
    ("metricsWindowSeconds=5", "at '/metricsWindowSeconds'"),
    ("ports.metrics=70000", "at '/ports/metrics': maximum"),
    ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
])
def test_schema_rejects_bad_values_with_a_clear_message(helm: str, setting: str, message: str) -> None:
    for command in (["lint", "--strict", str(CHART)], ["template", "kvscale", str(CHART)]):
        result = run_helm(helm, *command, "--set", setting)
        assert result.returncode != 0, f"helm {command[0]} accepted {setting}"
        assert message in result.stdout + result.stderr, result.stdout + result.stderr


def test_default_render_is_cluster_wide_standalone_and_locked_down(helm: str) -> None:
    docs = render(helm)
    assert {d["kind"] for d in docs} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service",
                                         "Deployment"}
    role = one(docs, "ClusterRole", "ops-kvscale")
    assert rules_of(role) == NAMESPACED_RULES | CLUSTER_RULES
    deployment = one(docs, "Deployment", "kvscale")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    c = container(docs)
    assert c["image"] == "ghcr.io/kvscale/kvscale-operator:0.1.0"
    assert "command" not in c  # the image's ENTRYPOINT: kvscale run
    assert c["args"] == ["--scan-interval=30", "--liveness=http://0.0.0.0:8080/healthz", "--metrics-port=8081",
                         "--log-level=info", "--log-format=json"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] == 65532 and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"health": 8080, "metrics": 8081}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert any(v["name"] == "tmp" and "emptyDir" in v for v in pod["volumes"])
    assert {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    service = one(docs, "Service", "kvscale-metrics")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kvscale", "namespace": "ops"}]


@pytest.mark.parametrize("sets", [(), ("watchNamespaces={a,b}",), ("replicaCount=3",),
                                  ("replicaCount=2", "watchNamespaces={a}")])
def test_no_rule_grants_secrets_wildcards_or_deletes(helm: str, sets: tuple[str, ...]) -> None:
    """The one delete: the serving workload kvscale owns, when a plan moves between one node and several per
    replica (a Deployment <-> a LeaderWorkerSet; the operator sends the uid it owns as a precondition)."""
    workloads = {("apps", "deployments"), ("leaderworkerset.x-k8s.io", "leaderworkersets")}
    for doc in render(helm, *sets):
        if doc["kind"] in ("ClusterRole", "Role"):
            for group, resource, verb in rules_of(doc):
                assert resource != "secrets" and "*" not in (group, resource, verb)
                assert verb not in ("deletecollection", "escalate", "bind", "impersonate")
                assert verb != "delete" or (group, resource) in workloads, (group, resource, verb)


def test_namespace_scoped_render(helm: str) -> None:
    docs = render(helm, "watchNamespaces={team-a,team-b}")
    for ns in ("team-a", "team-b"):
        role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == ns)
        assert rules_of(role) == NAMESPACED_RULES
        binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == ns)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": role["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kvscale", "namespace": "ops"}]
    # Cluster-scoped only: node capacity, CRDs for kopf, namespaces for kopf's namespace observer.
    cluster_role = one(docs, "ClusterRole")
    assert rules_of(cluster_role) == CLUSTER_RULES | {("", "namespaces", "list"), ("", "namespaces", "watch")}
    args = container(docs)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert not any(a.startswith("--peering") for a in args)


def test_replicas_above_one_use_peering(helm: str) -> None:
    docs = render(helm, "replicaCount=2")
    assert "--peering=kvscale" in container(docs)["args"]
    assert "--peering-lifetime=30" in container(docs)["args"]
    assert one(docs, "ClusterKopfPeering", "kvscale")["apiVersion"] == "kopf.dev/v1"
    assert ("kopf.dev", "clusterkopfpeerings", "patch") in rules_of(one(docs, "ClusterRole"))
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "podAntiAffinity" in deployment["spec"]["template"]["spec"]["affinity"]

    scoped = render(helm, "replicaCount=2", "watchNamespaces={team-a}", "peering.name=llm-ops")
    peering = one(scoped, "KopfPeering", "llm-ops")
    assert peering["metadata"]["namespace"] == "team-a"
    assert "--peering=llm-ops" in container(scoped)["args"]
    assert ("kopf.dev", "kopfpeerings", "patch") in rules_of(one(scoped, "Role"))
    assert not [d for d in scoped if d["kind"] == "ClusterKopfPeering"]


def test_operator_flags_follow_the_values(helm: str) -> None:
    result = run_helm(helm, "template", "kvscale", str(CHART), "--set", "logLevel=debug", "--set",
                      "logFormat=plain", "--set", "prometheusUrl=http://prometheus.monitoring.svc:9090",
                      "--set-json", 'gpuPrices={"L4": 0.71, "H100-SXM": 2.99}', "--set", "scanInterval=2.5",
                      "--set", "metricsWindowSeconds=30", "--set", "image.tag=dev-1")
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    c = container(docs)
    assert c["image"] == "ghcr.io/kvscale/kvscale-operator:dev-1"
    assert c["args"] == ["--scan-interval=2.5", "--liveness=http://0.0.0.0:8080/healthz", "--metrics-port=8081",
                         "--log-level=debug", "--log-format=plain",
                         "--prometheus-url=http://prometheus.monitoring.svc:9090", "--metrics-window=30",
                         "--gpu-price=H100-SXM=2.99", "--gpu-price=L4=0.71"]
    # ... and `kvscale run` accepts exactly these flags.
    from kvscale.cli.main import build_parser

    parsed = build_parser().parse_args(["run", *c["args"]])
    assert parsed.scan_interval == 2.5 and parsed.gpu_price == ["H100-SXM=2.99", "L4=0.71"]
    assert parsed.metrics_window == 30


def test_service_monitor_and_dashboard_are_optional(helm: str) -> None:
    kinds = {d["kind"] for d in render(helm)}
    assert "ServiceMonitor" not in kinds and "ConfigMap" not in kinds
    docs = render(helm, "metrics.serviceMonitor.enabled=true", "grafanaDashboard.enabled=true",
                  "metrics.serviceMonitor.labels.release=prometheus")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = one(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    dashboard = one(docs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["kvscale.json"]) == json.loads(
        (CHART / "dashboards" / "kvscale.json").read_text())


def render_notes(helm: str, tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it (helm template skips NOTES, and a client-only install still
    wants a cluster): a copy of the chart renders it through `tpl` into a ConfigMap."""
    chart = tmp_path / "kvscale"
    shutil.copytree(CHART, chart)
    shutil.copy(CHART / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n'
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | quote }}}\n')
    args = ["template", "kvscale", str(chart), "--namespace", "ops", "--show-only", "templates/zz-notes.yaml"]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    notes: str = yaml.safe_load(result.stdout)["data"]["notes"]
    return notes


def test_notes_tell_what_to_do_next(helm: str, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path / "default")
    assert "kubectl get llmd -A" in notes
    assert "kubectl apply -n default -f" in notes and "examples/llama-3.1-8b-l4.yaml" in notes
    assert "rollout status deployment/kvscale" in notes
    assert "prometheusUrl" in notes  # autoscaling is off until it is set
    scoped = render_notes(helm, tmp_path / "scoped", "watchNamespaces={team-a}", "replicaCount=2",
                          "prometheusUrl=http://prom:9090")
    assert "kubectl apply -n team-a -f" in scoped and "It watches only: team-a." in scoped
    assert "one works, the others stand by" in scoped
    assert "prometheusUrl" not in scoped


def test_kube_version_floor(helm: str) -> None:
    ok = run_helm(helm, "template", "kvscale", str(CHART), "--kube-version", "1.28.0")
    assert ok.returncode == 0, ok.stderr
    old = run_helm(helm, "template", "kvscale", str(CHART), "--kube-version", "1.27.9")
    assert old.returncode != 0 and "kubeVersion" in old.stderr, old.stderr

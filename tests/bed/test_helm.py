"""The Helm chart on the real bed (issue 6's proof): lint, server-side validation of the rendered
objects, install/uninstall, values rejected by the schema, and RBAC that is enough and no more:
the operator runs in-process with a real token of the chart's ServiceAccount and reconciles an
example end to end, while `kubectl auth can-i` shows what it cannot do.

Shared bed: releases use `--skip-crds` (the llmdeployments CRD is shared and never deleted), every
release, namespace and ClusterRole is unique per test and removed afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from bedkit import Kube, wait_until
from helm_support import (
    CHART,
    Helm,
    Release,
    apply_peering_crds,
    can_i,
    helm_binary,
    http_get,
    running_operator_as,
    set_args,
    unique,
    write_token_kubeconfig,
)
from operator_harness import condition, get, install_crd, wait_condition

from kvscale.catalog import find_model_entry
from kvscale.controllers.telemetry import Telemetry

# Alone on the bed, after the two-lane phase (tests/testbed/run-bed-tests.sh):
# its operators run cluster-wide and would reconcile the other lane's resources.
pytestmark = pytest.mark.bed_exclusive

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-3.1-8b-l4.yaml"
EXAMPLE_NAME = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]


@pytest.fixture(scope="module")
def helm(kube: Kube) -> Helm:
    binary = helm_binary()
    if binary is None:
        pytest.fail("no helm binary in the test bed (make testbed-build installs it)", pytrace=False)
    install_crd(kube)  # idempotent: the shared CRD from crds/, identical to the chart's (unit test)
    return Helm(kube, binary)


def apply_example(kube: Kube, namespace: str) -> None:
    result = kube.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    assert result.returncode == 0, result.stderr


def server_dry_run(kube: Kube, manifest: str) -> None:
    """Every rendered object carries its namespace (helm template --namespace), so no -n here."""
    result = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
    assert result.returncode == 0, f"server-side dry run rejected the chart:\n{result.stderr}\n{manifest[:3000]}"


def kinds(manifest: str) -> list[tuple[str, str, str | None]]:
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    return [(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs]


def apply_config_map_model(kube: Kube, namespace: str) -> str:
    """A variant of the example whose architecture comes from a ConfigMap (spec.model.configMapRef),
    so the operator's `get configmaps` permission is exercised too."""
    config = find_model_entry("meta-llama/Llama-3.1-8B-Instruct").config
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "custom-llama-config"},
                  "data": {"config.json": json.dumps(config)}}
    document = yaml.safe_load(EXAMPLE.read_text())
    document["metadata"]["name"] = "custom-llama"
    document["spec"]["model"] = {"name": "acme/custom-llama-8b", "precision": "bf16",
                                 "configMapRef": {"name": "custom-llama-config"}}
    text = yaml.safe_dump_all([config_map, document])
    result = kube.kubectl("apply", "-n", namespace, "-f", "-", input=text)
    assert result.returncode == 0, result.stderr
    return "custom-llama"


def assert_reconciled_end_to_end(kube: Kube, operator: Any, namespace: str) -> dict[str, Any]:
    apply_example(kube, namespace)
    custom = apply_config_map_model(kube, namespace)
    llmd = wait_condition(kube, namespace, EXAMPLE_NAME, "Planned", "True", timeout=90)
    wait_condition(kube, namespace, custom, "Planned", "True", timeout=60)
    for name in (EXAMPLE_NAME, custom):
        wait_until(partial(get, kube, "deployment", namespace, name), 60, f"the serving Deployment {name}")
        wait_until(partial(get, kube, "service", namespace, name), 60, f"the serving Service {name}")
        assert operator.reconciled.get((namespace, name)), f"this operator (chart's RBAC) did not reconcile {name}"
    # ... and the periodic resync (a list of LLMDeployments at the operator's scope) reconciles again.
    seen = operator.reconciled[(namespace, EXAMPLE_NAME)]
    wait_until(lambda: operator.reconciled[(namespace, EXAMPLE_NAME)] > seen, 30, "a resync pass")
    assert operator.state.failures == 0, operator.records.messages
    assert operator.forbidden() == [], operator.forbidden()
    status, body = http_get(operator.health_url)  # the endpoint the chart's probes call
    assert status == 200, body
    return llmd


# --- lint and server-side validation ------------------------------------------------------------

def test_helm_lint_strict_passes(helm: Helm) -> None:
    result = helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_chart_crds_are_accepted_by_the_api_server(kube: Kube, helm: Helm) -> None:
    shown = helm("show", "crds", str(CHART), check=True).stdout
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(shown) if d}
    assert names == {"llmdeployments.kvscale.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    result = kube.kubectl("apply", "--dry-run=server", "-f", str(CHART / "crds"))
    assert result.returncode == 0, result.stderr
    # The bed's llmdeployments CRD serves the same version and schema root as the chart's copy.
    chart_crd = yaml.safe_load((CHART / "crds" / "llmdeployments.kvscale.dev.yaml").read_text())
    live = json.loads(kube.kubectl("get", "crd", "llmdeployments.kvscale.dev", "-o", "json", check=True).stdout)
    assert [v["name"] for v in live["spec"]["versions"]] == [v["name"] for v in chart_crd["spec"]["versions"]]
    assert live["spec"]["names"]["shortNames"] == chart_crd["spec"]["names"]["shortNames"]


def test_default_values_pass_server_side_dry_run(kube: Kube, helm: Helm, namespace: str) -> None:
    manifest = helm.template("kvscale", namespace, "--include-crds")
    found = kinds(manifest)
    assert ("Deployment", "kvscale", namespace) in found
    assert ("ClusterRole", f"{namespace}-kvscale", None) in found
    assert not [k for k in found if k[0] in ("Role", "RoleBinding", "ClusterKopfPeering", "KopfPeering")]
    server_dry_run(kube, manifest)


def test_namespace_scoped_values_pass_server_side_dry_run(
        kube: Kube, helm: Helm, namespace: str, make_namespace: Callable[[str], str]) -> None:
    watched = make_namespace("watched")
    manifest = helm.template("kvscale", namespace, *set_args({"watchNamespaces": f"{{{watched}}}"}))
    found = kinds(manifest)
    assert ("Role", "kvscale", watched) in found and ("RoleBinding", "kvscale", watched) in found
    server_dry_run(kube, manifest)


def test_everything_on_passes_server_side_dry_run(
        kube: Kube, helm: Helm, namespace: str, make_namespace: Callable[[str], str]) -> None:
    apply_peering_crds(kube)
    watched = make_namespace("watched")
    for scope in ({}, {"watchNamespaces": f"{{{watched}}}"}):
        manifest = helm.template(
            "kvscale", namespace,
            *set_args({"replicaCount": "2", "prometheusUrl": "http://prometheus.monitoring.svc:9090",
                       "grafanaDashboard.enabled": "true", "logLevel": "debug", **scope},
                      {"gpuPrices": {"H100-SXM": 2.5, "L4": 0.7}, "scanInterval": 7.5}))
        found = {k[0] for k in kinds(manifest)}
        assert {"PodDisruptionBudget", "ConfigMap"} <= found
        assert ("KopfPeering" if scope else "ClusterKopfPeering") in found
        server_dry_run(kube, manifest)


# --- values the schema rejects ---------------------------------------------------------------------

@pytest.mark.parametrize(("setting", "message"), [
    ("replicaCount=-1", "at '/replicaCount': minimum: got -1, want 0"),
    ("logLevel=verbose", "at '/logLevel': value must be one of 'debug', 'info', 'warning', 'error'"),
    ("scanInterval=abc", "at '/scanInterval'"),
])
def test_bad_values_are_rejected_before_anything_is_created(
        kube: Kube, helm: Helm, namespace: str, setting: str, message: str) -> None:
    result = helm("install", "kvscale", str(CHART), "--namespace", namespace, "--skip-crds", "--set", setting)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr
    assert json.loads(helm("list", "--namespace", namespace, "--all", "-o", "json", check=True).stdout) == []
    assert kube.apps.list_namespaced_deployment(namespace).items == []


# --- install / uninstall ---------------------------------------------------------------------------

def test_install_creates_rbac_service_and_operator_and_uninstall_removes_them(
        kube: Kube, helm: Helm, namespace: str) -> None:
    # The strictest Pod Security Standard: the operator pod must still be admitted.
    kube.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", check=True)
    release_name = unique("kvs")
    with helm.release(release_name, namespace) as release:
        fullname = release.fullname
        deployment = wait_until(lambda: get(kube, "deployment", namespace, fullname), 30, "operator Deployment")
        pod_spec = deployment["spec"]["template"]["spec"]
        container = pod_spec["containers"][0]
        assert container["image"] == "ghcr.io/kvscale/kvscale-operator:0.1.0"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod_spec["serviceAccountName"] == release.service_account
        assert get(kube, "serviceaccount", namespace, release.service_account) is not None
        assert kube.kubectl("get", "clusterrole", release.cluster_name).returncode == 0
        binding = json.loads(kube.kubectl("get", "clusterrolebinding", release.cluster_name, "-o", "json",
                                          check=True).stdout)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": release.service_account,
                                        "namespace": namespace}]
        service = get(kube, "service", namespace, f"{fullname}-metrics")
        assert service is not None
        assert service["spec"]["ports"][0]["port"] == 8081
        assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        crd = json.loads(kube.kubectl("get", "crd", "llmdeployments.kvscale.dev", "-o", "json", check=True).stdout)
        assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])

        # Admitted under `restricted`; no GPU request, so it schedules on a (fake, kwok) node and is
        # marked Running there.
        def running_pod() -> dict[str, Any] | None:
            pods = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-l",
                                           f"app.kubernetes.io/instance={release_name}", "-o", "json",
                                           check=True).stdout)["items"]
            return next((p for p in pods if p["status"].get("phase") == "Running"), None)

        pod = wait_until(running_pod, 60, "the operator pod Running (kwok)")
        assert pod["spec"]["nodeName"]
        assert wait_until(lambda: can_i(kube, release.user, "list", "llmdeployments.kvscale.dev"), 10, "RBAC")
    # helm uninstall (the context manager's exit) removes everything it created.
    assert kube.kubectl("get", "clusterrole", release.cluster_name).returncode != 0
    assert kube.kubectl("get", "clusterrolebinding", release.cluster_name).returncode != 0
    assert get(kube, "deployment", namespace, fullname) is None
    assert get(kube, "service", namespace, f"{fullname}-metrics") is None
    assert get(kube, "serviceaccount", namespace, release.service_account) is None
    assert kube.kubectl("get", "crd", "llmdeployments.kvscale.dev").returncode == 0  # CRDs stay (crds/)


# --- RBAC: enough and no more ------------------------------------------------------------------------

def assert_no_secrets(kube: Kube, release: Release, namespaces: list[str]) -> None:
    for verb in ("get", "list", "watch"):
        assert not can_i(kube, release.user, verb, "secrets")
        for ns in namespaces:
            assert not can_i(kube, release.user, verb, "secrets", ns)


def test_cluster_wide_rbac_is_enough_and_no_more(
        kube: Kube, helm: Helm, namespace: str, make_namespace: Callable[[str], str], tmp_path: Path) -> None:
    workload = make_namespace("work")
    with helm.release(unique("kvs"), namespace) as release:
        user = release.user
        wait_until(lambda: can_i(kube, user, "watch", "llmdeployments.kvscale.dev"), 10, "RBAC in effect")
        kubeconfig = write_token_kubeconfig(kube, namespace, release.service_account, tmp_path / "sa.kubeconfig")
        with running_operator_as(kubeconfig, act_in=[workload], metrics=True) as operator:
            llmd = assert_reconciled_end_to_end(kube, operator, workload)
            planned = condition(llmd, "Planned")
            assert planned is not None and planned["status"] == "True"
            assert operator.metrics_url is not None
            _, metrics = http_get(operator.metrics_url)  # what the chart's metrics Service exposes
            names = {m.name for m in Telemetry().registry.collect()}
            assert all(name in metrics for name in names), metrics[:2000]

        assert_no_secrets(kube, release, [namespace, workload, "kube-system"])
        for verb, resource in [("watch", "llmdeployments.kvscale.dev"), ("patch", "llmdeployments.kvscale.dev/status"),
                               ("create", "deployments.apps"), ("list", "nodes"), ("get", "configmaps"),
                               ("list", "customresourcedefinitions.apiextensions.k8s.io")]:
            assert can_i(kube, user, verb, resource), (verb, resource)
        assert can_i(kube, user, "create", "leaderworkersets.leaderworkerset.x-k8s.io")
        for verb, resource in [("delete", "llmdeployments.kvscale.dev"),
                               ("create", "llmdeployments.kvscale.dev"), ("list", "configmaps"),
                               ("update", "configmaps"), ("delete", "services"), ("create", "pods"),
                               ("update", "nodes"), ("create", "clusterkopfpeerings.kopf.dev"),
                               ("patch", "clusterkopfpeerings.kopf.dev"), ("list", "namespaces"),
                               ("create", "roles.rbac.authorization.k8s.io"), ("impersonate", "serviceaccounts")]:
            assert not can_i(kube, user, verb, resource), (verb, resource)


def test_namespace_scoped_rbac_is_enough_and_no_more(
        kube: Kube, helm: Helm, namespace: str, make_namespace: Callable[[str], str], tmp_path: Path) -> None:
    watched, other = make_namespace("watched"), make_namespace("other")
    with helm.release(unique("kvs"), namespace, "--set", f"watchNamespaces={{{watched}}}") as release:
        user = release.user
        wait_until(lambda: can_i(kube, user, "create", "deployments.apps", watched), 10, "RBAC in effect")
        args = release.manifest()
        deployment = next(d for d in args if d["kind"] == "Deployment")
        assert f"--namespace={watched}" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        kubeconfig = write_token_kubeconfig(kube, namespace, release.service_account, tmp_path / "sa.kubeconfig")
        with running_operator_as(kubeconfig, namespaces=[watched], act_in=[watched]) as operator:
            assert_reconciled_end_to_end(kube, operator, watched)

        assert can_i(kube, user, "create", "deployments.apps", watched)
        assert not can_i(kube, user, "create", "deployments.apps", other)
        assert not can_i(kube, user, "create", "deployments.apps", namespace)
        assert not can_i(kube, user, "create", "deployments.apps")  # not cluster-wide
        assert not can_i(kube, user, "list", "llmdeployments.kvscale.dev")
        assert not can_i(kube, user, "get", "llmdeployments.kvscale.dev", other)
        assert not can_i(kube, user, "get", "configmaps", other)
        assert can_i(kube, user, "list", "nodes")  # GPU capacity is cluster-scoped
        assert can_i(kube, user, "watch", "customresourcedefinitions.apiextensions.k8s.io")
        assert_no_secrets(kube, release, [namespace, watched, other])


@pytest.mark.parametrize("scope", ["cluster-wide", "namespace-scoped"])
def test_two_replicas_use_kopf_peering_with_the_charts_rbac(
        kube: Kube, helm: Helm, namespace: str, make_namespace: Callable[[str], str], tmp_path: Path,
        scope: str) -> None:
    apply_peering_crds(kube)
    work = make_namespace("work")
    extra = ["--set", "replicaCount=2"]
    if scope == "namespace-scoped":
        extra += ["--set", f"watchNamespaces={{{work}}}"]
    with helm.release(unique("kvs"), namespace, *extra) as release:
        peering = release.fullname
        if scope == "cluster-wide":
            kind, where = "clusterkopfpeering.kopf.dev", []
        else:
            kind, where = "kopfpeering.kopf.dev", ["-n", work]
        assert kube.kubectl("get", kind, peering, *where).returncode == 0
        manifest = release.manifest()
        deployment = next(d for d in manifest if d["kind"] == "Deployment")
        assert deployment["spec"]["replicas"] == 2
        assert f"--peering={peering}" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert any(d["kind"] == "PodDisruptionBudget" for d in manifest)

        user = release.user
        wait_until(lambda: can_i(kube, user, "create", "deployments.apps", work), 10, "RBAC in effect")
        kubeconfig = write_token_kubeconfig(kube, namespace, release.service_account, tmp_path / "sa.kubeconfig")
        namespaces = [work] if scope == "namespace-scoped" else []
        with running_operator_as(kubeconfig, namespaces=namespaces, act_in=[work], peering=peering) as operator:

            def keepalive() -> dict[str, Any] | None:
                obj = json.loads(kube.kubectl("get", kind, peering, *where, "-o", "json", check=True).stdout)
                return obj.get("status") or None

            peers = wait_until(keepalive, 30, f"the operator's keep-alive in {kind} {peering}")
            assert all(p.get("priority", 0) > 0 for p in peers.values()), peers
            assert_reconciled_end_to_end(kube, operator, work)
    assert kube.kubectl("get", kind, peering, *where).returncode != 0  # uninstall removed it

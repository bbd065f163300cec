"""Upgrades over live resources, and what `helm uninstall` leaves (issue 15).

One release (namespace-scoped, so the test owns everything it touches) and the operator run as the
release's ServiceAccount (a real token), reconciling an example:

1. `helm upgrade` to a new image tag and new values: the operator's own Deployment rolls, and the
   serving Deployment and Service kvscale made are untouched (same resourceVersion), also by the
   operator that starts after the upgrade (it writes nothing for unchanged resources).
2. A CRD that adds an optional field, applied as docs/install.md says (server-side apply over the
   live CRD): the existing LLMDeployment keeps its spec and status, nothing is rewritten, and a new
   resource may use the field. The original CRD is put back afterwards (the bed shares it).
3. `helm uninstall` follows docs/install.md: the release's objects (operator Deployment, RBAC,
   ServiceAccount, metrics Service) go; the CRD, the LLMDeployments and the serving Deployments and
   Services they own stay (running, unmanaged).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from bedkit import Kube, wait_until
from helm_support import CHART, Helm, helm_binary, running_operator_as, unique, write_token_kubeconfig
from operator_harness import CRD, apply, get, install_crd, load_document, resource_versions, wait_condition, wait_quiet

# Alone on the bed, after the two-lane phase (tests/testbed/run-bed-tests.sh):
# it upgrades the shared LLMDeployment CRD.
pytestmark = pytest.mark.bed_exclusive

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-3.1-8b-l4.yaml"
NAME = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]


def crd_with_an_optional_field() -> dict[str, Any]:
    """The CRD of this repository plus spec.serving.priorityClassName (optional, no default)."""
    crd: dict[str, Any] = copy.deepcopy(yaml.safe_load(CRD.read_text()))
    serving = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["serving"]
    serving["properties"]["priorityClassName"] = {"type": "string", "description": "Added by a newer release."}
    return crd


def server_side_apply(kube: Kube, document: dict[str, Any]) -> None:
    result = kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(document))
    assert result.returncode == 0, result.stderr


def test_upgrade_and_crd_change_over_live_resources_then_uninstall_leaves_what_the_docs_say(
        kube: Kube, namespace: str, make_namespace: Callable[[str], str], tmp_path: Path) -> None:
    binary = helm_binary()
    assert binary is not None, "no helm binary in the test bed (make testbed-build installs it)"
    helm = Helm(kube, binary)
    install_crd(kube)
    work = make_namespace("work")
    release = unique("kvs")
    helm("install", release, str(CHART), "--namespace", namespace, "--skip-crds",
         "--set", f"watchNamespaces={{{work}}}", check=True)
    try:
        fullname = release if "kvscale" in release else f"{release}-kvscale"
        kubeconfig = write_token_kubeconfig(kube, namespace, fullname, tmp_path / "sa.kubeconfig")
        with running_operator_as(kubeconfig, namespaces=[work], act_in=[work]) as operator:
            apply(kube, work, load_document(EXAMPLE))
            wait_condition(kube, work, NAME, "Planned", "True", timeout=90)
            wait_until(lambda: get(kube, "service", work, NAME), 60, "the serving Service")
            served = wait_quiet(kube, work, [NAME], lambda: operator.state.resyncs)

        # 1. A new image tag and new values.
        before = get(kube, "deployment", namespace, fullname)
        assert before is not None
        helm("upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values",
             "--set", "image.tag=0.1.1", "--set", "logLevel=debug", "--set", "scanInterval=15", check=True)
        after = get(kube, "deployment", namespace, fullname)
        assert after is not None
        container = after["spec"]["template"]["spec"]["containers"][0]
        assert container["image"].endswith(":0.1.1") and "--log-level=debug" in container["args"]
        assert after["metadata"]["generation"] > before["metadata"]["generation"]  # the operator rolls
        assert resource_versions(kube, work, [NAME]) == served  # helm never touches what kvscale made
        with running_operator_as(kubeconfig, namespaces=[work], act_in=[work]) as upgraded:
            wait_quiet(kube, work, [NAME], lambda: upgraded.state.resyncs)
            assert upgraded.state.writes == 0 and upgraded.state.failures == 0
            assert resource_versions(kube, work, [NAME]) == served

            # 2. A CRD change that adds an optional field, over the live resource.
            llmd_before = get(kube, "llmd", work, NAME)
            assert llmd_before is not None
            try:
                server_side_apply(kube, crd_with_an_optional_field())
                wait_until(lambda: "priorityClassName" in kube.kubectl(
                    "explain", "llmd.spec.serving", check=True).stdout, 30, "the new CRD to be served")
                llmd_after = get(kube, "llmd", work, NAME)
                assert llmd_after is not None
                assert (llmd_after["spec"], llmd_after["status"]) == (llmd_before["spec"], llmd_before["status"])
                newer = load_document(EXAMPLE, name="uses-new-field", changes={"serving.priorityClassName": "high"})
                apply(kube, work, newer)
                stored = get(kube, "llmd", work, "uses-new-field")
                assert stored is not None and stored["spec"]["serving"]["priorityClassName"] == "high"
                kube.kubectl("delete", "llmd", "uses-new-field", "-n", work, "--wait=true", check=True)
                wait_quiet(kube, work, [NAME], lambda: upgraded.state.resyncs)
                assert resource_versions(kube, work, [NAME]) == served
            finally:
                install_crd(kube)  # the bed's CRD again (kubectl apply of the generated one)
    finally:
        # 3. Uninstall, and what it leaves.
        helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s", check=True)
    assert get(kube, "deployment", namespace, fullname) is None
    assert get(kube, "serviceaccount", namespace, fullname) is None
    assert get(kube, "service", namespace, f"{fullname}-metrics") is None
    assert kube.kubectl("get", "role", fullname, "-n", work).returncode != 0
    assert kube.kubectl("get", "crd", "llmdeployments.kvscale.dev").returncode == 0
    assert get(kube, "llmd", work, NAME) is not None
    kept = resource_versions(kube, work, [NAME])
    assert {k: v for k, v in kept.items() if not k.startswith("llmd/")} == {
        k: v for k, v in served.items() if not k.startswith("llmd/")}, "the serving objects changed"
    assert json.loads(kube.kubectl("get", "deployment", NAME, "-n", work, "-o", "json", check=True).stdout)[
        "metadata"]["ownerReferences"][0]["kind"] == "LLMDeployment"

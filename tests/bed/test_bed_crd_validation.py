"""Issue 3 proof (2): the real apiserver validates custom resources against a CRD's OpenAPI
schema, and `kubectl apply --dry-run=server` reports it without persisting anything."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bedkit import Kube, wait_until

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CRD = "widgets.test.kvscale.dev"

pytestmark = pytest.mark.bed


@pytest.fixture(scope="module")
def widget_crd(kube: Kube) -> Iterator[str]:
    created = kube.kubectl("apply", "-f", str(FIXTURES / "widgets-crd.yaml"))
    assert created.returncode == 0, created.stderr
    established = kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    assert established.returncode == 0, established.stderr
    # Established is set by the apiserver; discovery can lag a moment behind it.
    wait_until(
        lambda: kube.kubectl("get", "widgets.test.kvscale.dev", "-A").returncode == 0,
        timeout=30,
        what="widgets in discovery",
    )
    yield CRD
    kube.kubectl("delete", "crd", CRD, "--wait=false")


def dry_run(kube: Kube, namespace: str, fixture: str) -> tuple[int, str]:
    result = kube.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(FIXTURES / fixture))
    return result.returncode, result.stdout + result.stderr


def test_crd_is_established_with_its_schema(kube: Kube, widget_crd: str) -> None:
    crd = kube.apiext.read_custom_resource_definition(widget_crd)
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    replicas = crd.spec.versions[0].schema.open_apiv3_schema.properties["spec"].properties["replicas"]
    assert (replicas.type, replicas.minimum) == ("integer", 1)


def test_valid_widget_passes_server_dry_run(kube: Kube, namespace: str, widget_crd: str) -> None:
    rc, out = dry_run(kube, namespace, "widget-valid.yaml")
    assert rc == 0, out
    assert "widget.test.kvscale.dev/valid created (server dry run)" in out
    # A dry run persists nothing.
    listed = kube.custom.list_namespaced_custom_object("test.kvscale.dev", "v1", namespace, "widgets")
    assert listed["items"] == []


def test_zero_replicas_rejected_by_minimum(kube: Kube, namespace: str, widget_crd: str) -> None:
    rc, out = dry_run(kube, namespace, "widget-zero.yaml")
    assert rc != 0, out
    assert 'The Widget "zero" is invalid' in out
    assert "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1" in (out)


def test_string_replicas_rejected_by_type(kube: Kube, namespace: str, widget_crd: str) -> None:
    rc, out = dry_run(kube, namespace, "widget-string.yaml")
    assert rc != 0, out
    assert 'The Widget "text" is invalid' in out
    assert 'spec.replicas in body must be of type integer: "string"' in out


def test_valid_widget_really_created(kube: Kube, namespace: str, widget_crd: str) -> None:
    applied = kube.kubectl("apply", "-n", namespace, "-f", str(FIXTURES / "widget-valid.yaml"))
    assert applied.returncode == 0, applied.stderr
    obj = kube.custom.get_namespaced_custom_object("test.kvscale.dev", "v1", namespace, "widgets", "valid")
    assert obj["spec"] == {"replicas": 2, "model": "kvscale/test-model"}

"""The Helm chart and the operator image, without a cluster (issue 6).

Checks on files run everywhere; checks that render the chart need the helm binary of the test bed
(~/.cache/kvscale/testbed/bin/helm, from `make testbed-build`) and skip without it, unless
KVSCALE_BED=1 or CI=true, where a missing helm is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from bedkit import BIN_DIR, bed_required

from kvscale.catalog import load_catalog
from kvscale.controllers.telemetry import Telemetry

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kvscale"
SCHEMA_PATH = CHART / "values.schema.json"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


# --- files ---------------------------------------------------------------------------------------

def test_chart_crd_is_identical_to_the_generated_one() -> None:
    chart_copy = CHART / "crds" / "llmdeployments.kvscale.dev.yaml"
    assert chart_copy.read_bytes() == (ROOT / "crds" / "llmdeployments.kvscale.dev.yaml").read_bytes(), (
        "helm/kvscale/crds/ is stale: run `make crds` (or cp crds/llmdeployments.kvscale.dev.yaml helm/kvscale/crds/)")


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "kvscale"
    assert chart["kubeVersion"] == ">=1.28.0-0"
    assert chart["appVersion"] == "0.1.0" == PYPROJECT["project"]["version"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "ghcr.io/kvscale/kvscale-operator"
    assert values["image"]["tag"] == ""  # the appVersion


def test_kopf_peering_crds_are_kopfs() -> None:
    docs = [d for d in yaml.safe_load_all((CHART / "crds" / "kopf-peerings.yaml").read_text()) if d]
    found = {(d["spec"]["group"], d["spec"]["names"]["kind"], d["spec"]["names"]["plural"], d["spec"]["scope"])
             for d in docs}
    assert found == {("kopf.dev", "ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
                     ("kopf.dev", "KopfPeering", "kopfpeerings", "Namespaced")}
    for doc in docs:
        assert doc["metadata"]["name"] == f"{doc['spec']['names']['plural']}.{doc['spec']['group']}"
        status = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True  # kopf writes its peers there


def test_values_yaml_has_a_comment_line_before_every_key() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for number, line in enumerate(lines):
        if re.match(r"^\s*[A-Za-z][\w.-]*:", line):
            previous = lines[number - 1].strip() if number else ""
            if not previous.startswith("#"):
                undocumented.append(f"values.yaml:{number + 1}: {line.strip()}")
    assert undocumented == []


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return loaded


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/definitions/"), ref
        return resolve(schema()["definitions"][ref.removeprefix("#/definitions/")])
    return node


def walk(node: Any, path: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, child in node.items():
            if key in ("enum", "const", "default", "examples", "required"):
                continue
            yield from walk(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from walk(child, f"{path}/{i}")


def test_values_and_schema_have_the_same_keys() -> None:
    """Every value is described by the schema and every schema property has a documented default."""

    def compare(values: dict[str, Any], node: dict[str, Any], path: str) -> list[str]:
        node = resolve(node)
        props = node.get("properties")
        if props is None:  # a map (gpuPrices, labels, ...) or a pass-through object: keys are data
            return []
        problems = [f"{path}.{k}: in values.yaml, not in the schema" for k in values if k not in props]
        if values:  # an empty default ({}, e.g. affinity) leaves its optional keys out
            problems += [f"{path}.{k}: in the schema, not in values.yaml" for k in props
                         if k not in values and not (path == "" and k == "global")]
        for key, value in values.items():
            if isinstance(value, dict) and key in props:
                problems += compare(value, props[key], f"{path}.{key}")
        return problems

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert compare(values, schema(), "") == []


SCHEMA_KEYWORDS = {
    "$schema", "$id", "$ref", "$comment", "title", "description", "type", "properties", "additionalProperties",
    "required", "definitions", "items", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minLength", "maxLength", "pattern", "uniqueItems", "propertyNames", "oneOf", "anyOf",
    "allOf", "not", "default", "examples", "minItems", "maxItems",
}
JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def test_schema_is_well_formed_draft_07() -> None:
    """A structural check of values.schema.json; helm also validates it against the draft-07 meta-schema
    whenever it renders (test_default_values_lint_strict)."""
    doc = schema()
    assert doc["$schema"] == "http://json-schema.org/draft-07/schema#"
    containers = {"properties", "definitions"}
    for path, node in walk(doc):
        if path.rsplit("/", 1)[-1] in containers:
            continue  # a name -> schema map, not a schema
        unknown = set(node) - SCHEMA_KEYWORDS
        assert not unknown, f"{path}: unknown keywords {unknown}"
        if "type" in node:
            assert node["type"] in JSON_TYPES, f"{path}: type {node['type']!r}"
        if "pattern" in node:
            re.compile(node["pattern"])
        if "$ref" in node:
            resolve(node)
        if isinstance(node.get("exclusiveMinimum"), bool):
            pytest.fail(f"{path}: exclusiveMinimum must be a number in draft 07")


def test_schema_closes_every_object() -> None:
    """`additionalProperties` at each level: false for records, a schema for maps, true only for
    Kubernetes objects passed through to the API server (affinity terms)."""
    open_objects = []
    for path, node in walk(schema()):
        if node.get("type") == "object" and "additionalProperties" not in node:
            open_objects.append(path)
        if node.get("type") == "object" and "properties" in node and node.get("additionalProperties") is not False:
            assert path == "#/properties/global", f"{path}: a record must have additionalProperties: false"
        if node.get("additionalProperties") is True:
            assert "validated by the API server" in node.get("description", "") or path == "#/properties/global", path
    assert open_objects == []


def test_schema_gpu_names_are_the_catalogs() -> None:
    names = schema()["properties"]["gpuPrices"]["propertyNames"]["enum"]
    assert sorted(names) == sorted(e.name for e in load_catalog().gpu_entries())


def test_dashboard_queries_use_the_operators_metrics() -> None:
    dashboard = json.loads((CHART / "dashboards" / "kvscale.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bkvscale_\w+", e)}
    registry = Telemetry().registry
    exposed = {m.name for m in registry.collect()} | {f"{m.name}_total" for m in registry.collect()
                                                      if m.type == "counter"}
    assert used and used <= exposed, used - exposed
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("desired replicas", "ttft", "tpot", "reconciles", "errors"):
        assert topic in titles
    for metric in ("kvscale_desired_replicas", "kvscale_predicted_ttft_seconds", "kvscale_observed_ttft_seconds",
                   "kvscale_predicted_tpot_seconds", "kvscale_observed_tpot_seconds", "kvscale_reconciles_total"):
        assert metric in used
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


# --- the image ---------------------------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerignore_excludes(path: str) -> bool:
    """Docker's .dockerignore semantics, enough for our patterns: the last matching rule wins, a rule
    matching a parent directory applies to everything under it, `!` re-includes."""

    def to_regex(pattern: str) -> str:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return f"^{out}$"

    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            rules.append((negate, to_regex(line.lstrip("!").strip("/"))))
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, regex in rules:
        if any(re.match(regex, c) for c in candidates):
            excluded = not negate
    return excluded


def context_files() -> list[str]:
    """The files `docker build .` would send: the repository minus what .dockerignore excludes
    (excluded directories are pruned unless a `!` rule re-includes something under them)."""
    negated = [line.strip()[1:].strip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip().startswith("!")]
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = Path(dirpath).relative_to(ROOT).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [d for d in dirnames if not dockerignore_excludes(rel_dir + d)
                       or any(n == rel_dir + d or n.startswith(rel_dir + d + "/") for n in negated)]
        files += [rel_dir + f for f in filenames if not dockerignore_excludes(rel_dir + f)]
    return sorted(files)


def test_dockerfile_is_multi_stage_pinned_and_non_root() -> None:
    instructions = dockerfile_instructions()
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base), base
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert len(froms) >= 2 and all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms), froms
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1] == "65532:65532"
    final_stage = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM"):]
    assert ("ENTRYPOINT", '["kvscale", "run"]') in final_stage
    assert json.loads(dict(final_stage)["ENTRYPOINT"]) == ["kvscale", "run"]  # exec form: no shell
    assert not [w for w, _ in instructions if w == "ADD"]
    assert "kvscale" in PYPROJECT["project"]["scripts"]


def test_dockerfile_copies_only_what_exists_and_is_in_the_context() -> None:
    sources = []
    for word, rest in dockerfile_instructions():
        if word == "COPY" and "--from=" not in rest:
            *srcs, _dest = rest.split()
            sources += [s for s in srcs if not s.startswith("--")]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert not dockerignore_excludes(src), f"COPY {src}: excluded by .dockerignore"
    for junk in (".venv/bin/python", ".testbed/kubeconfig", ".git/HEAD", "tests/conftest.py",
                 "operator/kvscale/__pycache__/x.pyc"):
        assert dockerignore_excludes(junk), f"{junk} would be sent to the docker build"


def test_image_build_context_makes_a_working_package(tmp_path: Path) -> None:
    """What `docker build` would do, without Docker: copy the build context (after .dockerignore) and
    build the package from it with setuptools; the result must carry its data files and run."""
    context = tmp_path / "context"
    for path in context_files():
        (context / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, context / path)
    assert sorted(p.name for p in context.iterdir()) == ["README.md", "operator", "pyproject.toml"]
    build = tmp_path / "lib"
    result = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
                             "--build-lib", str(build)], cwd=context, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    shipped = {p.relative_to(build / "kvscale").as_posix() for p in (build / "kvscale").rglob("*") if p.is_file()}
    package_files = {p.relative_to(ROOT / "operator" / "kvscale").as_posix()
                     for p in (ROOT / "operator" / "kvscale").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts}
    assert package_files <= shipped, package_files - shipped
    example = ROOT / "examples" / "llama-3.1-8b-l4.yaml"
    code = ("import sys, kvscale; from kvscale.cli import main; "
            f"assert kvscale.__file__.startswith({str(build)!r}), kvscale.__file__; "
            f"sys.exit(main(['plan', '-f', {str(example)!r}, '-o', 'json']))")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(build), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)


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
    *{("apps", "deployments", v) for v in ("get", "list", "watch", "create", "patch", "update")},
    *{("", "services", v) for v in ("get", "create", "patch")},
    ("", "configmaps", "get"),
    *{("", "pods", v) for v in ("get", "list", "watch")},
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
    for doc in render(helm, *sets):
        if doc["kind"] in ("ClusterRole", "Role"):
            for group, resource, verb in rules_of(doc):
                assert resource != "secrets" and "*" not in (group, resource, verb)
                assert verb not in ("delete", "deletecollection", "escalate", "bind", "impersonate")


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
                      "--set", "image.tag=dev-1")
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    c = container(docs)
    assert c["image"] == "ghcr.io/kvscale/kvscale-operator:dev-1"
    assert c["args"] == ["--scan-interval=2.5", "--liveness=http://0.0.0.0:8080/healthz", "--metrics-port=8081",
                         "--log-level=debug", "--log-format=plain",
                         "--prometheus-url=http://prometheus.monitoring.svc:9090",
                         "--gpu-price=H100-SXM=2.99", "--gpu-price=L4=0.71"]
    # ... and `kvscale run` accepts exactly these flags.
    from kvscale.cli.main import build_parser

    parsed = build_parser().parse_args(["run", *c["args"]])
    assert parsed.scan_interval == 2.5 and parsed.gpu_price == ["H100-SXM=2.99", "L4=0.71"]


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

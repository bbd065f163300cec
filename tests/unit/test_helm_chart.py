"""The Helm chart and the operator image, without a cluster (issue 6).

Checks on files only: they need nothing but Python. The checks that render the chart with the real
helm binary are tests/bed/test_helm_render.py (helm comes from the bed's build).
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
    # One version for the package, the chart, its appVersion (the image tag it deploys) and the image.
    assert chart["appVersion"] == chart["version"] == PYPROJECT["project"]["version"]
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
    # One version: the package's, which the chart's appVersion and the image's label repeat.
    assert args["VERSION"] == PYPROJECT["project"]["version"]
    assert 'org.opencontainers.image.version="${VERSION}"' in dict(final_stage)["LABEL"]


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

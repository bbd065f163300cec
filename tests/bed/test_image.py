"""The operator image (`make image`) run as the Helm chart runs it, against the bed (issue 15).

The chart is installed with `replicaCount=0` (the bed's kwok nodes cannot run a real container), and
its rendered Deployment is what podman runs: the same image, arguments and environment, the same
user (65532, non-root), a read-only root filesystem with a /tmp tmpfs, every capability dropped, no
privilege escalation, and the chart's ServiceAccount credentials mounted where a pod gets them (a
real token from `kubectl create token`, the bed's CA, the namespace), with KUBERNETES_SERVICE_HOST
and _PORT pointing at the bed's API server. The container's operator must reconcile an example in
the namespace the release watches, and serve /healthz and /metrics.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bedctl import bed_ports
from bedkit import STATE_DIR, Kube, Prometheus, bed_required, free_port, wait_until
from helm_support import Helm, helm_binary, http_get, set_args, unique
from operator_harness import apply, get, install_crd, load_document, required_condition

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-3.1-8b-l4.yaml"
PODMAN = ["podman", "--runtime", "runc"]
# Explicit limits at or below this process's own: runc may not raise them on such hosts (as image/build.sh).
NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
LIMITS = ["--ulimit", f"nofile={NOFILE}:{NOFILE}", "--ulimit", "nproc=4096:4096"]


@pytest.fixture(scope="module")
def image() -> str:
    """`make image` (cached: a rebuild with nothing changed takes seconds); its tag."""
    if shutil.which("podman") is None and not bed_required():
        pytest.skip("no podman: `make image` installs it (as root) and builds the image")
    result = subprocess.run(["bash", str(ROOT / "image" / "build.sh")], capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture
def helm(kube: Kube) -> Helm:
    binary = helm_binary()
    assert binary is not None, "no helm binary in the test bed (make testbed-build installs it)"
    install_crd(kube)
    return Helm(kube, binary)


def chart_container(manifest: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(d for d in manifest if d["kind"] == "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def pod_credentials(kube: Kube, namespace: str, service_account: str, folder: Path) -> Path:
    """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""
    folder.mkdir(parents=True)
    token = kube.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h", check=True).stdout
    (folder / "token").write_text(token.strip())
    shutil.copy(STATE_DIR / "pki" / "ca.crt", folder / "ca.crt")
    (folder / "namespace").write_text(namespace)
    for path in (folder, *folder.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the container's user
    return folder


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"kvscale-operator-{uuid.uuid4().hex[:6]}"
    yield name
    subprocess.run([*PODMAN, "rm", "--force", "--time", "5", name], capture_output=True, timeout=60)


def test_the_image_reconciles_as_the_chart_runs_it(kube: Kube, namespace: str, prometheus: Prometheus, helm: Helm,
                                                  image: str, container_name: str, tmp_path: Path) -> None:
    health_port, metrics_port = free_port(), free_port()
    repository, tag = image.rsplit(":", 1)
    values = {"replicaCount": "0", "watchNamespaces[0]": namespace, "prometheusUrl": prometheus.url,
              "ports.health": str(health_port), "ports.metrics": str(metrics_port), "scanInterval": "5",
              "logFormat": "plain", "image.repository": repository, "image.tag": tag}
    with helm.release(unique("img"), namespace, *set_args(values)) as release:
        container = chart_container(release.manifest())
        assert container["image"] == image
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
        secrets = pod_credentials(kube, namespace, release.service_account, tmp_path / "serviceaccount")
        env = {e["name"]: e.get("value", container_name) for e in container["env"]}  # POD_ID: the pod's name
        env |= {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": bed_ports()["APISERVER_PORT"]}
        run = [*PODMAN, "run", "--detach", "--name", container_name, "--network", "host", *LIMITS,
               "--user", f"{security['runAsUser']}:{security['runAsGroup']}", "--read-only",
               "--tmpfs", "/tmp:rw,size=64m,mode=1777", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges",
               "--volume", f"{secrets}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
               *[f"--env={k}={v}" for k, v in env.items()], image, *container["args"]]
        started = subprocess.run(run, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stderr

        def logs() -> str:
            return subprocess.run([*PODMAN, "logs", container_name], capture_output=True, text=True,
                                  timeout=30).stdout[-3000:]

        health = f"http://127.0.0.1:{health_port}/healthz"
        wait_until(lambda: http_get(health)[0] == 200, 90, f"the container's /healthz ({logs()})")
        apply(kube, namespace, load_document(EXAMPLE))
        name = load_document(EXAMPLE)["metadata"]["name"]
        planned = wait_until(lambda: (o := get(kube, "llmd", namespace, name))
                             and required_condition(o, "Planned")["status"] == "True" and o,
                             90, "Planned by the container")
        wait_until(lambda: get(kube, "deployment", namespace, name), 60, "the Deployment it creates")
        deployment = kube.apps.read_namespaced_deployment(name, namespace)
        managers = {m.manager for m in deployment.metadata.managed_fields}
        assert "kvscale" in managers, managers  # written by the container, under its field manager
        assert planned["status"]["observedGeneration"] == planned["metadata"]["generation"]

        # kopf keeps a probe's answer for 10 s: the count shows once the answer from start-up expires.
        wait_until(lambda: json.loads(http_get(health)[1])["reconciles"]["reconciles"] >= 1, 30,
                   "the probe to count the container's reconciles")
        status, metrics = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert status == 200 and 'kvscale_reconciles_total{result="ok"}' in metrics
        inspected = json.loads(subprocess.run([*PODMAN, "inspect", container_name], capture_output=True, text=True,
                                              check=True, timeout=30).stdout)[0]
        assert inspected["Config"]["User"] == f"{security['runAsUser']}:{security['runAsGroup']}"
        assert inspected["HostConfig"]["ReadonlyRootfs"] is True
        assert "forbidden" not in logs().lower(), logs()

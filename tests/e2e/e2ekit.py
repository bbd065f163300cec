"""Helpers shared by the e2e tests (and the demo): the operator with live metrics, applying resources,
and a recorder of replicas and conditions over time."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from bedkit import Kube

REPO_ROOT = Path(__file__).resolve().parents[2]
SCALE_SUBJECT = "kvscale.dev/llmdeployment"


@contextmanager
def operator_with_metrics(kube: Kube, namespaces: tuple[str, ...], prometheus_url: str,
                          scan_interval_s: float = 2.0) -> Iterator[Any]:
    """The operator in-process (a kopf operator in a thread) with `--prometheus-url`.

    Uses tests/bed/operator_harness.running_operator when it takes `prometheus_url`; until then the
    same wiring with `OperatorConfig.prometheus_url` set (delete the fallback once the harness has it).
    """
    import operator_harness

    with operator_harness.running_operator(kube, scan_interval_s=scan_interval_s, namespaces=namespaces,
                                           prometheus_url=prometheus_url) as running:
        yield running


def apply(kube: Kube, namespace: str, document: Mapping[str, Any] | str) -> None:
    text = document if isinstance(document, str) else yaml.safe_dump(dict(document))
    result = kube.kubectl("apply", "-n", namespace, "-f", "-", input=text)
    assert result.returncode == 0, result.stderr


def running_pods(kube: Kube, namespace: str, llmdeployment: str) -> list[str]:
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"{SCALE_SUBJECT}={llmdeployment}").items
    return sorted(p.metadata.name for p in pods
                  if p.status.phase == "Running" and p.metadata.deletion_timestamp is None)


def deployment_replicas(kube: Kube, namespace: str, name: str) -> tuple[int, int]:
    """(spec.replicas, status.readyReplicas) of a Deployment."""
    d = kube.apps.read_namespaced_deployment(name, namespace)
    return int(d.spec.replicas or 0), int(d.status.ready_replicas or 0)


def llmdeployment(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kube.custom.get_namespaced_custom_object("kvscale.dev", "v1alpha1", namespace,
                                                                   "llmdeployments", name)
    return obj


def condition_status(obj: Mapping[str, Any], type_: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return str(c.get("status"))
    return None


@dataclass
class Sample:
    t: float  # seconds since the recorder started
    replicas: int  # Deployment spec.replicas
    ready: int
    desired: int | None  # LLMDeployment status.desiredReplicas
    last_decision: dict[str, Any] | None
    metrics_unavailable: str | None  # status of the MetricsUnavailable condition


@dataclass
class Recorder:
    """Samples a deployment's replicas and the LLMDeployment's status every `interval_s` in a thread."""

    kube: Kube
    namespace: str
    name: str
    interval_s: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _t0: float = field(default_factory=time.monotonic)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Recorder:
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def now(self) -> float:
        return time.monotonic() - self._t0

    def sample(self) -> Sample:
        replicas, ready = deployment_replicas(self.kube, self.namespace, self.name)
        status = (llmdeployment(self.kube, self.namespace, self.name).get("status") or {})
        return Sample(t=self.now(), replicas=replicas, ready=ready, desired=status.get("desiredReplicas"),
                      last_decision=status.get("lastScaleDecision"),
                      metrics_unavailable=condition_status({"status": status}, "MetricsUnavailable"))

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a blip of the API server: the next sample will do
                self.samples.append(self.sample())
            self._stop.wait(self.interval_s)

    def between(self, start: float, end: float = float("inf")) -> list[Sample]:
        return [s for s in self.samples if start <= s.t <= end]

    def first(self, predicate: Any, after: float = 0.0) -> Sample | None:
        return next((s for s in self.samples if s.t >= after and predicate(s)), None)

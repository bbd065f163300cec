"""Helpers shared by the e2e tests (and the demo): the operator with live metrics, applying resources,
and a recorder of replicas and conditions over time."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bedkit import InferenceSim, Kube, Prometheus, wait_until
from loadgen import LoadGenerator, Surge, TraceRequest, find_trace, rate_scale_for, read_trace, replay_schedule
from operator_harness import apply as apply  # re-exported: the e2e tests take it from here
from podsim import PodSim, SimConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
SCALE_SUBJECT = "kvscale.dev/llmdeployment"


RESOURCE = Path(__file__).resolve().parent / "fixtures" / "llama-3.1-8b-h100-autoscale.yaml"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TIME_SCALE = 15  # trace seconds per real second
SCAN_INTERVAL_S = 2.0  # the operator's resync; Prometheus scrapes every 2 s


@dataclass
class Stack:
    """The operator (in-process, with live metrics), simulated serving pods and the conversation trace."""

    kube: Kube
    prometheus: Prometheus
    namespace: str
    sims: PodSim
    trace: list[TraceRequest]
    operator: Any  # operator_harness.RunningOperator, or None when the test runs its own

    def deploy(self, name: str, **spec_changes: Any) -> int:
        """Apply the resource; wait for its planned replicas to run simulators; return that count."""
        from operator_harness import load_document

        apply(self.kube, self.namespace, load_document(RESOURCE, name=name, **spec_changes))
        replicas = wait_until(lambda: self.kube.apps.read_namespaced_deployment(name, self.namespace).spec.replicas,
                              90, f"Deployment {name}")
        for endpoint in self.sims.wait_for(name, replicas, timeout=90, namespace=self.namespace):
            self.prometheus.wait_for_target_up(endpoint, timeout=30)
        return int(replicas)

    def load(self, name: str, base_rps: float, duration_s: float, surge: Surge | None = None,
             seed: int = 1) -> LoadGenerator:
        schedule = replay_schedule(
            self.trace, time_scale=TIME_SCALE, rate_scale=rate_scale_for(self.trace, TIME_SCALE, base_rps,
                                                                         duration_s=duration_s),
            surge=surge, duration_s=duration_s, max_context_tokens=8192, seed=seed)
        return LoadGenerator(schedule, lambda: self.sims.endpoints(name, self.namespace), MODEL,
                             max_duration_s=duration_s, max_in_flight=400, drain_timeout_s=60, seed=seed)


@contextmanager
def serving_pods(kube: Kube, prometheus: Prometheus, namespace: str,
                 spawn: Callable[[SimConfig, int], InferenceSim] | None = None) -> Iterator[Stack]:
    """Pod simulators for `namespace` (or what `spawn` starts per pod), no operator (the test brings its own)."""
    import operator_harness

    operator_harness.install_crd(kube)
    with PodSim(kube, prometheus, [namespace], spawn=spawn) as sims:
        yield Stack(kube, prometheus, namespace, sims, read_trace(find_trace()), None)


@contextmanager
def serving_stack(kube: Kube, prometheus: Prometheus, namespace: str, operator_prometheus_url: str | None = None,
                  spawn: Callable[[SimConfig, int], InferenceSim] | None = None,
                  **operator_options: Any) -> Iterator[Stack]:
    """Pod simulators for `namespace` and the operator watching it with `--prometheus-url` (the bed's
    Prometheus unless `operator_prometheus_url` says otherwise, e.g. a fault injector in front of it)."""
    import operator_harness

    with serving_pods(kube, prometheus, namespace, spawn) as stack, operator_harness.running_operator(
            kube, scan_interval_s=SCAN_INTERVAL_S, namespaces=(namespace,),
            prometheus_url=operator_prometheus_url or prometheus.url, **operator_options) as running:
        stack.operator = running
        yield stack


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

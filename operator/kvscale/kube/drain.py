"""Graceful scale-down, pure: how long a replica may take to finish what it serves, the preStop hook that
waits for it, and which pods a scale-down should remove.

Why a hook at all: vLLM's API server answers SIGTERM by cancelling its server task (serve_http's signal
handler), so every request still streaming is cut. Kubernetes removes a terminating pod from the Service's
endpoints at once but runs the preStop hook *before* SIGTERM, so a hook that waits until the engine has
nothing running or queued lets those requests finish; the termination grace period bounds the wait (the
kubelet kills the container once it is over, hook or not), so it is set from the longest request the plan
expects rather than Kubernetes' 30 s default.

Which pods go: the ReplicaSet controller removes pods with the lowest
`controller.kubernetes.io/pod-deletion-cost` first (among pods equally ready). Just before a scale-down the
operator writes each pod's in-flight requests there, so the idle replicas go and the busy ones keep serving.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvscale.api.spec import Engine, LLMDeploymentSpec

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
# A cost is an int32; requests in flight are written in tenths, so a pod averaging 0.4 requests over the
# smoothing window still ranks above an idle one.
COST_PER_REQUEST = 10
MAX_COST = 2**31 - 1

# Endpoint removal takes a moment to reach kube-proxy and gateways; requests routed meanwhile still arrive.
ENDPOINT_PROPAGATION_S = 5
# From SIGTERM to exit: the engine's workers and CUDA contexts are torn down.
ENGINE_SHUTDOWN_S = 15
# Kubernetes' own default is the floor; an hour is the ceiling (a stuck request must not pin a GPU forever).
MIN_GRACE_S = 30
MAX_GRACE_S = 3600
# The output length taken as "the longest request": this quantile of the geometric distribution around the
# mean (what the planner assumes without percentiles), or the highest percentile the spec states if longer.
LONGEST_OUTPUT_QUANTILE = 0.999
DRAIN_POLL_S = 1

# Gauges of requests an engine is running or queueing, in its /metrics exposition.
BUSY_GAUGES: Mapping[Engine, tuple[str, ...]] = {
    Engine.VLLM: ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    Engine.SGLANG: ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
}


def longest_output_tokens(spec: LLMDeploymentSpec, max_model_len: int) -> int:
    """The output length of the longest request to wait for, at most what fits in the context."""
    workload = spec.workload
    geometric = math.ceil(workload.output_tokens * math.log(1.0 / (1.0 - LONGEST_OUTPUT_QUANTILE)))
    stated = max((tokens for _p, tokens in workload.percentile_points(workload.output_tokens_percentiles)),
                 default=0.0)
    return max(1, min(max(geometric, math.ceil(stated)), max_model_len - 1))


def longest_request_s(spec: LLMDeploymentSpec, max_model_len: int, predicted_ttft_ms: float | None,
                      predicted_tpot_ms: float | None) -> float:
    """Seconds the longest request takes while the SLOs hold: its first token by the TTFT bound, then every
    other token at the TPOT bound. The bound is the SLO, or the plan's prediction where that is higher (an
    infeasible plan running anyway)."""
    ttft_ms = max(spec.slo.ttft_ms, predicted_ttft_ms or 0.0)
    tpot_ms = max(spec.slo.tpot_ms, predicted_tpot_ms or 0.0)
    return (ttft_ms + (longest_output_tokens(spec, max_model_len) - 1) * tpot_ms) / 1000.0


def termination_grace_s(longest_s: float) -> int:
    """terminationGracePeriodSeconds: endpoint propagation, the longest request, the engine's shutdown."""
    wanted = math.ceil(ENDPOINT_PROPAGATION_S + longest_s + ENGINE_SHUTDOWN_S)
    return min(max(wanted, MIN_GRACE_S), MAX_GRACE_S)


def drain_script(engine: Engine, port: int, metrics_path: str, budget_s: int,
                 settle_s: float = ENDPOINT_PROPAGATION_S) -> str:
    """Python for the preStop hook (both engines' images have python3; neither is sure to have curl).

    Waits `settle_s` for endpoint removal to propagate, then until the engine reports nothing running or waiting, at
    most `budget_s`. A /metrics that does not answer ends the wait: the engine is gone or hung, and waiting
    would only delay the kill the grace period ends with anyway.
    """
    names = "|".join(BUSY_GAUGES[engine])
    return "\n".join([
        "import re, time, urllib.request",
        f"time.sleep({settle_s:g})",
        f"deadline = time.monotonic() + {budget_s}",
        f"busy = re.compile(r'^(?:{names})(?:{{[^}}]*}})? (\\S+)$', re.M)",
        "while time.monotonic() < deadline:",
        "    try:",
        f"        text = urllib.request.urlopen('http://127.0.0.1:{port}{metrics_path}', timeout=5).read().decode()",
        "    except Exception:",
        "        break",
        "    if sum(float(v) for v in busy.findall(text)) == 0:",
        "        break",
        f"    time.sleep({DRAIN_POLL_S})",
    ])


def drain_lifecycle(engine: Engine, port: int, metrics_path: str, grace_s: int) -> dict[str, Any]:
    """The container's `lifecycle`: a preStop hook that drains within the grace period (less the shutdown)."""
    budget_s = max(grace_s - ENGINE_SHUTDOWN_S - ENDPOINT_PROPAGATION_S, 1)
    return {"preStop": {"exec": {"command": ["python3", "-c", drain_script(engine, port, metrics_path, budget_s)]}}}


@dataclass(frozen=True)
class DeletionCost:
    pod: str
    cost: int


def _labels_match(pod: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def deletion_costs(pods: Sequence[Mapping[str, Any]], selector: Mapping[str, str],
                   in_flight_by_pod: Mapping[str, float]) -> list[DeletionCost]:
    """The cost to write on each live pod of the deployment: its requests in flight (running and waiting),
    in tenths. A pod with no figure (not scraped yet) costs 0, like an idle one: the ReplicaSet already
    removes pods that are not ready first. Pods whose annotation already holds the cost are left out (no
    write)."""
    costs = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or not _labels_match(pod, selector) or not meta.get("name"):
            continue
        load = in_flight_by_pod.get(meta["name"], 0.0)
        cost = min(round(max(load, 0.0) * COST_PER_REQUEST), MAX_COST) if math.isfinite(load) else 0
        if (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION) != str(cost):
            costs.append(DeletionCost(meta["name"], cost))
    return sorted(costs, key=lambda c: c.pod)

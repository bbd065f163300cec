"""Re-planning on the bed (tracker issue 17): a resource declared for 1,024/256-token requests is served a
replayed trace of long prompts and short outputs. In Recommend mode the operator, from what it scraped, reports
a cheaper configuration with other flags in status.recommendation, and an Event, and changes nothing. Then
spec.scaling.replan is set to Auto: the move starts (a second Deployment), the operator is stopped while the
new pods start (a 20 s start-up) and a new one resumes the move from status; it ends with the new Deployment
alone, the proposed flags, the old fleet's Ready replicas kept until the new fleet was Ready, and no request
of the replayed load failed.

The resource: Llama-3.1-8B on H100 or L4, nothing pinned. For 2 req/s of 1,024/256 tokens the planner picks
one replica of four L4s (TP4): the cheapest that holds TTFT 2.5 s and TPOT 50 ms. The load: the Azure
conversation trace replayed at 1 req/s with every prompt five times longer (capped to the 8,192-token
context) and outputs capped at 150 tokens, so the calibrated shape is ~5,000 prompt / ~100 output tokens.
On four L4s those prompts need several replicas to hold the TTFT SLO; one H100 needs fewer GPU-dollars.
The sustain window and the interval are 30 s here (defaults 1,800 and 300) so the test takes minutes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from bedkit import Kube, Prometheus, wait_until
from e2ekit import MODEL, RESOURCE, SCALE_SUBJECT, SCAN_INTERVAL_S, TIME_SCALE, Stack, llmdeployment, serving_pods
from loadgen import LoadGenerator, TraceRequest, rate_scale_for, replay_schedule
from operator_harness import apply, events, flag, load_document, running_operator

MAX_CONTEXT = 8192
OUTPUT_CAP = 150
LOAD_S = 480.0  # the load runs until the move is done (then stops): the recommendation takes ~2-3 minutes
STARTUP_DELAY_S = 20


def long_prompts(stack: Stack, rate_rps: float, duration_s: float) -> list[TraceRequest]:
    schedule = replay_schedule(stack.trace, time_scale=TIME_SCALE,
                               rate_scale=rate_scale_for(stack.trace, TIME_SCALE, rate_rps, duration_s=duration_s),
                               duration_s=duration_s, max_output_tokens=OUTPUT_CAP, seed=17)
    return [TraceRequest(r.at_s, min(5 * r.input_tokens, MAX_CONTEXT - r.output_tokens), r.output_tokens)
            for r in schedule]


def _args(kube: Kube, namespace: str, name: str) -> list[str]:
    container = kube.apps.read_namespaced_deployment(name, namespace).spec.template.spec.containers[0]
    return list(container.args or [])


@pytest.fixture
def pods(kube: Kube, prometheus: Prometheus, namespace: str) -> Iterator[Stack]:
    with serving_pods(kube, prometheus, namespace) as opened:
        yield opened


@dataclass
class FleetSample:
    t: float
    ready: dict[str, int]  # Ready replicas per Deployment of the resource
    wanted: dict[str, int]  # spec.replicas per Deployment


def _fleet(kube: Kube, namespace: str, name: str) -> tuple[dict[str, int], dict[str, int]]:
    found = kube.apps.list_namespaced_deployment(namespace, label_selector=f"{SCALE_SUBJECT}={name}").items
    return ({d.metadata.name: int(d.status.ready_replicas or 0) for d in found},
            {d.metadata.name: int(d.spec.replicas or 0) for d in found})


def _status(stack: Stack, name: str) -> dict[str, Any]:
    return llmdeployment(stack.kube, stack.namespace, name).get("status") or {}


@pytest.mark.timeout(900)
def test_long_prompts_get_a_cheaper_configuration_recommended_then_moved_to_across_a_restart(pods: Stack) -> None:
    name, kube, namespace = "replan", pods.kube, pods.namespace
    options: dict[str, Any] = {"scan_interval_s": SCAN_INTERVAL_S, "namespaces": (namespace,),
                               "prometheus_url": pods.prometheus.url}
    document = load_document(RESOURCE, name=name, changes={
        "gpu.types": ["H100-SXM", "L4"], "serving": {}, "workload.inputTokens": 1024, "workload.outputTokens": 256,
        "scaling.mode": "Recommend", "scaling.replanSustainSeconds": 30, "scaling.replanIntervalSeconds": 30,
        "scaling.replanMinHistorySeconds": 120,
        # a start-up long enough to restart the operator while the new Deployment comes up
        "serving.env": [{"name": "KVSCALE_BED_STARTUP_DELAY", "value": f"{STARTUP_DELAY_S}s"}]})
    schedule = long_prompts(pods, 1.0, LOAD_S)
    load = LoadGenerator(schedule, lambda: pods.sims.endpoints(name, namespace), MODEL, max_duration_s=LOAD_S,
                         max_in_flight=200, drain_timeout_s=60, seed=17)
    samples: list[FleetSample] = []
    stop_sampling = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while not stop_sampling.is_set():
            with contextlib.suppress(Exception):  # an API blip: the next sample will do
                ready, wanted = _fleet(kube, namespace, name)
                samples.append(FleetSample(time.monotonic() - t0, ready, wanted))
            stop_sampling.wait(0.5)

    sampler = threading.Thread(target=sample, name="fleet-sampler", daemon=True)
    try:
        with running_operator(kube, **options):
            apply(kube, namespace, document)
            replicas = wait_until(lambda: kube.apps.read_namespaced_deployment(name, namespace).spec.replicas, 90,
                                  f"Deployment {name}")
            for endpoint in pods.sims.wait_for(name, replicas, timeout=STARTUP_DELAY_S + 90, namespace=namespace):
                pods.prometheus.wait_for_target_up(endpoint, timeout=30)
            plan = _status(pods, name)["plan"]
            assert (plan["gpuType"], plan["tensorParallel"]) == ("L4", 4), plan
            args_before = _args(kube, namespace, name)
            load.start()
            sampler.start()

            def recommended() -> dict[str, Any] | None:
                rec = _status(pods, name).get("recommendation")
                return rec if rec and rec.get("recommended") else None

            try:
                rec = wait_until(recommended, LOAD_S - 180, "a recommendation")
            except AssertionError as exc:
                status = _status(pods, name)
                raise AssertionError(f"{exc}: last {status.get('recommendation')}; calibration "
                                     f"{status.get('calibration')}") from None
            _check_recommendation(pods, name, plan, rec, schedule)
            # Recommend: nothing moved.
            assert _args(kube, namespace, name) == args_before
            assert _status(pods, name)["plan"] == plan and _status(pods, name).get("move") is None

            # Auto: the move starts; the operator is stopped while the new Deployment comes up.
            kube.custom.patch_namespaced_custom_object("kvscale.dev", "v1alpha1", namespace, "llmdeployments", name,
                                                       {"spec": {"scaling": {"replan": "Auto"}}})
            try:
                move = wait_until(lambda: _status(pods, name).get("move"), 60, "a move to start")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {_status(pods, name).get('recommendation')}") from None
            assert move["phase"] == "Starting", move
        # the first operator is gone mid-move; a new one knows of the move only from status
        assert _status(pods, name).get("move") is not None, "the move ended before the restart"
        with running_operator(kube, **options):
            serving = wait_until(lambda: _status(pods, name).get("serving"), STARTUP_DELAY_S + 150,
                                 "the move to complete")
        load.stop()
        assert load.wait(120)
    finally:
        stop_sampling.set()
        load.stop()
    to = move["to"]
    assert serving["deployment"] == to["deployment"] and serving["gpuType"] == rec["proposed"]["gpuType"], serving
    # One consistent configuration: the new Deployment alone, running the proposed flags; the old one deleted.
    wanted = _fleet(kube, namespace, name)[1]
    assert list(wanted) == [to["deployment"]], wanted
    args = _args(kube, namespace, to["deployment"])
    assert flag(args, "--tensor-parallel-size") == str(to["tensorParallel"]), args
    assert flag(args, "--max-num-seqs") == str(to["maxNumSeqs"]), args
    reasons = [e.get("reason") for e in events(kube, namespace, name)]
    assert reasons.count("MoveStarted") == 1 and reasons.count("MoveCompleted") == 1, reasons  # resumed, not redone
    assert "MoveRolledBack" not in reasons, reasons
    # Capacity: the old fleet kept every Ready replica until the new one had all of its own Ready.
    old_ready = max(s.ready.get(name, 0) for s in samples[:5])
    switch = next(s.t for s in samples if s.ready.get(to["deployment"], 0) >= move["replicas"])
    before = [s for s in samples if s.t < switch]
    assert before and all(s.ready.get(name, 0) >= old_ready for s in before), [
        (round(s.t), s.ready) for s in samples[::4]]
    report = load.report()
    failed = [r.error for r in report.results if not r.ok]
    assert not failed, f"{len(failed)} of {len(report.results)} requests failed: {failed[:3]}"
    print(f"replan: moved {plan['gpuType']} TP{plan['tensorParallel']} -> {to['gpuType']} TP{to['tensorParallel']} "
          f"max-num-seqs {to['maxNumSeqs']} ({move['replicas']} replica(s)); {len(report.results)} requests, 0 failed; "
          f"fleet (s, ready): {[(round(s.t), s.ready) for s in samples[::10]]}")


def _check_recommendation(stack: Stack, name: str, plan: dict[str, Any], rec: dict[str, Any],
                          schedule: list[TraceRequest]) -> None:
    current, proposed, served = rec.get("current"), rec["proposed"], rec["served"]
    # What it was priced on is what was sent: long prompts, short outputs (the calibrated means).
    sent_in = sum(r.input_tokens for r in schedule) / len(schedule)
    assert served["inputTokens"] > 0.6 * sent_in and served["outputTokens"] < OUTPUT_CAP, (served, sent_in)
    assert served["minutes"] >= 2
    # Another configuration, with other flags, that holds the SLOs on that traffic; and either the running one,
    # priced on the same traffic, costs at least 15% more, or (as the calibrated model finds on this bed, whose
    # L4 simulator prefills ~0.5 ms/token: 2-4 s for these prompts) it holds no SLO there at all.
    flags = ("gpuType", "tensorParallel", "pipelineParallel", "maxNumSeqs", "maxModelLen")
    running = (plan["gpuType"], plan["tensorParallel"], plan["pipelineParallel"], plan["maxNumSeqs"],
               plan["maxModelLen"])
    assert tuple(proposed[f] for f in flags) != running, rec
    assert proposed["minutesShort"] == 0, rec
    if current is not None:
        assert tuple(current[f] for f in flags) == running, current
        assert rec["savingsPct"] >= 15 and proposed["costPerHour"] < current["costPerHour"], rec
    else:
        assert "holds no SLO" in rec["reason"], rec
    assert rec["cheaperSince"] <= rec["evaluatedAt"]
    found = [e for e in events(stack.kube, stack.namespace, name) if e.get("reason") == "ReplanRecommended"]
    assert found and f"{proposed['gpuType']} TP{proposed['tensorParallel']}" in found[-1]["message"], found

"""A ramp on the bed with a minute-long start-up and an operator restarted mid-ramp (tracker issue 14).

The serving pods take 60 s to become Ready (the bed's slow kwok stage, KVSCALE_BED_STARTUP_DELAY). The load
ramps linearly from 1 to 8 req/s over five minutes (the conversation trace's lengths, Poisson arrivals) and
then holds for 20 s. The resource pins the Holt-Winters forecaster, whose trend sees a ramp (Auto would still
be on last-value: it switches only after 15 scored minutes). Half-way up the ramp (150 s) the operator is stopped
and a new one started; it has no memory of its own and must seed its forecasts from Prometheus's history.

Asserted: the restarted operator's forecasts start from the minutes Prometheus kept, not from nothing; it
carries on scaling up the ramp; replicas added before the peak are Ready by then; no request fails.

Not asserted, because it does not hold yet (measured, see docs/operator.md): that every replica the peak
needs is Ready by the peak. In the run recorded there 4 replicas were Ready at the peak and the fleet
settled at 5-6 during the hold: the model starts uncalibrated (it expects 6.6 req/s per replica, the
simulators hold about 3.4) and calibration learns only from steady windows, which a ramp does not have.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from bedkit import Kube, Prometheus, wait_until
from e2ekit import MODEL, RESOURCE, SCAN_INTERVAL_S, Recorder, Stack, deployment_replicas, serving_pods
from loadgen import LoadGenerator, TraceRequest
from operator_harness import apply, load_document, running_operator

DELAY_S = 60
START_RPS, PEAK_RPS = 1.0, 8.0
# 20 s at the peak, not a minute: nothing is asserted after the peak but that no request fails, and CI's
# hour is tight. The ramp keeps its five minutes: on four, the fleet reached what the peak needs before the
# restart (Prometheus holds two closed minutes of the ramp only from about 150 s), so the restarted operator
# had nothing left to add.
RAMP_S, HOLD_S = 300.0, 20.0
RESTART_S = 150.0
MAX_REPLICAS = 6  # a lane test asks for at most 6 one-GPU replicas (docs/testing.md)


@pytest.fixture
def pods(kube: Kube, prometheus: Prometheus, namespace: str) -> Iterator[Stack]:
    with serving_pods(kube, prometheus, namespace) as opened:
        yield opened


def ramp_schedule(stack: Stack, seed: int = 7) -> list[TraceRequest]:
    """Poisson arrivals at START_RPS rising linearly to PEAK_RPS over RAMP_S, then PEAK_RPS for HOLD_S;
    prompt and output lengths drawn from the conversation trace."""
    rng = random.Random(seed)
    lengths = [(r.input_tokens, r.output_tokens) for r in stack.trace if r.input_tokens + r.output_tokens <= 8192]
    slope = (PEAK_RPS - START_RPS) / RAMP_S
    ramp_area = START_RPS * RAMP_S + slope * RAMP_S ** 2 / 2
    schedule: list[TraceRequest] = []
    area = 0.0
    while True:
        area += rng.expovariate(1.0)  # the arrivals' cumulative intensity: unit-rate Poisson in it
        if area <= ramp_area:  # invert START_RPS t + slope t^2 / 2 = area
            at = (-START_RPS + math.sqrt(START_RPS ** 2 + 2 * slope * area)) / slope
        else:
            at = RAMP_S + (area - ramp_area) / PEAK_RPS
        if at >= RAMP_S + HOLD_S:
            return schedule
        prompt, output = rng.choice(lengths)
        schedule.append(TraceRequest(at_s=at, input_tokens=prompt, output_tokens=output))


@pytest.mark.timeout(900)
def test_replicas_are_ready_before_the_ramp_peaks_across_an_operator_restart(pods: Stack) -> None:
    name = "ramp-ahead"
    key = (pods.namespace, name)
    options: dict[str, Any] = {"scan_interval_s": SCAN_INTERVAL_S, "namespaces": (pods.namespace,),
               "prometheus_url": pods.prometheus.url}
    document = load_document(RESOURCE, name=name, changes={
        "scaling.forecaster": "HoltWinters", "scaling.maxReplicas": MAX_REPLICAS,
        "serving.env": [{"name": "KVSCALE_BED_STARTUP_DELAY", "value": f"{DELAY_S}s"}]})
    schedule = ramp_schedule(pods)
    load = LoadGenerator(schedule, lambda: pods.sims.endpoints(name, pods.namespace), MODEL,
                         max_duration_s=RAMP_S + HOLD_S, max_in_flight=400, drain_timeout_s=60, seed=7)
    with Recorder(pods.kube, pods.namespace, name) as rec:
        with running_operator(pods.kube, **options):
            apply(pods.kube, pods.namespace, document)
            wait_until(lambda: deployment_replicas(pods.kube, pods.namespace, name)[1] >= 1, DELAY_S + 90,
                       "the first replica Ready")
            initial = deployment_replicas(pods.kube, pods.namespace, name)[0]
            pods.sims.wait_for(name, initial, timeout=30, namespace=pods.namespace)
            load.start()
            started = rec.now()
            wait_until(lambda: load.elapsed() >= RESTART_S, RAMP_S, "the restart's moment on the ramp", interval=1.0)
        restarted = rec.now()
        at_restart = deployment_replicas(pods.kube, pods.namespace, name)[0]
        # the first operator is gone: nothing of its forecasts survives but what Prometheus scraped
        with running_operator(pods.kube, **options) as second:
            wait_until(lambda: second.state.resyncs >= 1 and key in second.state.histories, 60,
                       "the restarted operator's first resync")
            seeded = second.state.histories[key].forecasts
            assert len(seeded.recent) >= 2, f"forecasts not seeded from Prometheus: {seeded}"
            assert seeded.holt_winters.level is not None and seeded.holt_winters.level > 0, seeded
            assert load.wait(RAMP_S + HOLD_S + 120)
    peak = started + RAMP_S
    report = load.report()
    timeline = [(round(s.t - started), s.replicas, s.ready) for s in rec.samples]

    ready_at_peak = max(s.ready for s in rec.between(peak - 5, peak))
    assert ready_at_peak > initial, f"no replica added and Ready before the peak: {timeline}"
    later = [s.replicas for s in rec.between(restarted + 10, peak)]
    if at_restart < MAX_REPLICAS:
        assert later and max(later) > at_restart, f"the restarted operator did not carry on scaling up: {timeline}"
    else:
        # The first operator's forecast saw the ramp early and reached maxReplicas before the restart (2 -> 6
        # at 126 s in a CI run on 2026-11-30): carrying on is then holding the ceiling through the ramp, not
        # starting over from fewer.
        assert later and min(later) == MAX_REPLICAS, f"the restarted operator gave up the ramp's replicas: {timeline}"
    failed = [r.error for r in report.results if not r.ok]
    assert not failed, f"{len(failed)} of {len(report.results)} requests failed: {failed[:3]}"
    needed = sorted(s.replicas for s in rec.between(peak, peak + HOLD_S))
    print(f"ramp-ahead: {ready_at_peak} replicas Ready at the peak; the hold ran "
          f"{needed[len(needed) // 2] if needed else '?'} (median); timeline (s, replicas, ready): {timeline[::10]}")

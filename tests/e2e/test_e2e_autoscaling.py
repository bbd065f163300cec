"""Autoscaling end to end (tracker issue 5): the operator's loop against simulated vLLM pods, Prometheus and
trace-replayed load on the real bed.

* a 4x load ramp raises replicas within a few scrape intervals, and p95 latencies return under the SLO;
* a load drop lowers replicas only after the scale-down stabilization window (30 s here);
* Prometheus killed (SIGKILL) holds replicas and sets MetricsUnavailable, which clears once it is restarted;
* Recommend mode records the decision in status but never changes the Deployment.

The resource (fixtures/llama-3.1-8b-h100-autoscale.yaml) is Llama-3.1-8B on H100 with max-num-seqs 16;
its simulators use the published 8b-h100-balanced latency profile, under which one replica sustains
about 3.4 req/s of the conversation trace (~16 concurrent / ~4.7 s per request) while the uncalibrated
planner expects 6.6: the loop has to calibrate to keep the SLO.
"""

from __future__ import annotations

import signal

import pytest
from bedctl import BED_PROMETHEUS
from bedkit import wait_until
from e2ekit import SCAN_INTERVAL_S, Recorder, Stack
from loadgen import Surge, percentile

TTFT_SLO_S, TPOT_SLO_S = 2.5, 0.050  # as in the fixture
STABILIZATION_S = 30


def test_load_ramp_scales_up_within_a_few_scrapes_and_latency_returns_under_slo(stack: Stack) -> None:
    name = "ramp"
    planned = stack.deploy(name)
    assert planned == 1
    ramp_at, end = 40.0, 160.0
    with Recorder(stack.kube, stack.namespace, name) as rec:
        load = stack.load(name, base_rps=1.5, duration_s=end, surge=Surge(4.0, ramp_at, end)).start()
        t_load = rec.now()
        assert load.wait(end + 90)
        report = load.report()

    ramp = t_load + ramp_at
    before = [s.replicas for s in rec.between(ramp - 10, ramp)]
    assert before and max(before) == planned, f"scaled before the ramp: {before}"
    first_up = rec.first(lambda s: s.replicas > planned, after=ramp)
    assert first_up is not None, f"never scaled up: {[(round(s.t), s.replicas) for s in rec.samples]}"
    assert first_up.t - ramp <= 45, f"first scale-up {first_up.t - ramp:.0f} s after the ramp"
    peak = max(s.replicas for s in rec.between(ramp))
    assert peak >= 2

    # Requests sent in the last 40 s of the surge, once the new replicas have taken the load, meet the SLO.
    tail = [r for r in report.results if end - 40 <= r.sent_s < end]
    assert tail and all(r.ok for r in tail), report.summary()
    ttft_p95 = percentile([r.ttft_s for r in tail if r.ttft_s is not None], 95)
    tpot_p95 = percentile([r.tpot_s for r in tail if r.tpot_s is not None], 95)
    assert ttft_p95 is not None and ttft_p95 <= TTFT_SLO_S, f"p95 TTFT {ttft_p95} s at {peak} replicas"
    assert tpot_p95 is not None and tpot_p95 <= TPOT_SLO_S, f"p95 TPOT {tpot_p95} s at {peak} replicas"


def test_load_drop_scales_down_only_after_the_stabilization_window(stack: Stack) -> None:
    name = "drop"
    # maxReplicas 3 while the high phase wants more: every recommendation of the high phase is 3, so any
    # scale-down is the load drop's, not the loop trimming an overshoot of its own (which it may, any time).
    ceiling = 3
    stack.deploy(name, **{"workload.requestsPerSecond": 6, "scaling.maxReplicas": ceiling})
    high_until, end = 60.0, 200.0
    # it must come down once the rate window (60 s) and the stabilization window have passed, with a scrape
    # interval, a resync and the window's tail of slack (a more conservative goodput needs the windowed rate
    # to fall further before one replica fewer holds it)
    latest_down_s = 60 + STABILIZATION_S + 45
    with Recorder(stack.kube, stack.namespace, name) as rec:
        # 8 req/s for a minute, then 0.5 req/s
        load = stack.load(name, base_rps=0.5, duration_s=end, surge=Surge(16.0, 0.0, high_until)).start()
        drop = rec.now() + high_until
        # what is asserted ends at the first scale-down after the drop (or its deadline): the low load is
        # stopped then rather than played to its end
        wait_until(lambda: rec.first(lambda s: s.replicas < ceiling, after=drop) or rec.now() > drop + latest_down_s,
                   high_until + latest_down_s + 30, "the first scale-down after the drop, or its deadline")
        load.stop()
        assert load.wait(90)

    timeline = [(round(s.t), s.replicas) for s in rec.samples]
    peak = max(s.replicas for s in rec.between(drop - 10, drop))
    assert peak == ceiling, f"the high phase did not reach maxReplicas {ceiling}: {timeline}"
    first_down = rec.first(lambda s: s.replicas < peak, after=drop)
    assert first_down is not None, f"never scaled down: {timeline}"
    # nothing may come down before a whole window of low recommendations (one resync of slack)
    assert first_down.t - drop >= STABILIZATION_S - SCAN_INTERVAL_S, (
        f"scaled down {first_down.t - drop:.0f} s after the drop, inside the {STABILIZATION_S} s window")
    # ...and it does come down in time
    assert first_down.t - drop <= latest_down_s


# Alone on the bed (tests/testbed/run-bed-tests.sh): it kills the bed's Prometheus, which every test reads.
@pytest.mark.bed_exclusive
def test_prometheus_outage_holds_replicas_and_sets_metrics_unavailable(stack: Stack) -> None:
    name = "outage"
    stack.deploy(name, **{"workload.requestsPerSecond": 12})  # planned for more than the light load below
    with Recorder(stack.kube, stack.namespace, name) as rec:
        # A light load throughout: with metrics the loop would scale down after its 30 s window; without
        # metrics it must hold. (It also keeps vllm:request_success_total fresh: the simulator creates
        # that series at its first request, where vLLM pre-creates it at zero.)
        load = stack.load(name, base_rps=1.0, duration_s=300).start()
        try:
            wait_until(lambda: rec.samples and rec.samples[-1].metrics_unavailable == "False", 90,
                       "MetricsUnavailable=False with fresh metrics")
            replicas = rec.samples[-1].replicas
            assert replicas >= 2
            with BED_PROMETHEUS.outage(signal.SIGKILL):  # killed, as a crash or an OOM kill does
                down_at = rec.now()
                wait_until(lambda: rec.samples[-1].metrics_unavailable == "True", 10 * SCAN_INTERVAL_S + 30,
                           "MetricsUnavailable=True while Prometheus is down")
                wait_until(lambda: rec.now() - down_at >= STABILIZATION_S + 20, 120, "the outage to last")
                during = [s.replicas for s in rec.between(down_at)]
            up_at = rec.now()
            stack.prometheus.wait_for_query("up", timeout=60)
            wait_until(lambda: rec.samples[-1].metrics_unavailable == "False" and rec.now() > up_at, 90,
                       "MetricsUnavailable=False once Prometheus is back")
        finally:
            load.stop()
            load.wait(90)

    assert during and set(during) == {replicas}, f"replicas moved without metrics: {during}"
    assert rec.first(lambda s: s.metrics_unavailable == "True", after=down_at) is not None
    assert rec.first(lambda s: s.metrics_unavailable == "False", after=up_at) is not None


def test_recommend_mode_updates_status_but_never_the_deployment(stack: Stack) -> None:
    name = "recommend"
    planned = stack.deploy(name, **{"scaling.mode": "Recommend"})
    with Recorder(stack.kube, stack.namespace, name) as rec:
        load = stack.load(name, base_rps=1.5, duration_s=90, surge=Surge(4.0, 10.0, 90.0)).start()
        decided = wait_until(lambda: (d := rec.samples[-1].last_decision) and d["toReplicas"] > planned and d,
                             120, "a recommended scale-up in status.lastScaleDecision")
        recommended_at = rec.now()
        wait_until(lambda: rec.now() - recommended_at >= 5 * SCAN_INTERVAL_S, 60, "five more resyncs")
        load.stop()
        assert load.wait(120)

    assert "Recommend" in decided["reason"]
    assert {s.replicas for s in rec.samples} == {planned}, "Recommend mode changed the Deployment"
    assert all(s.desired in (None, planned) for s in rec.samples)
    started = [h for h in stack.sims.history if h[1] == "start" and h[2].startswith(f"{stack.namespace}/{name}-")]
    assert len(started) == planned, f"pods were added: {started}"

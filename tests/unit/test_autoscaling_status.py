"""Calibration carried through status: the operator keeps it there between cycles (and restarts)."""

import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kvscale.api.spec import LLMDeploymentSpec, load_resource
from kvscale.api.status import LLMDeploymentStatus
from kvscale.autoscaler import Calibration, CalibrationSample, Observation, ScalingHistory, calibrate
from kvscale.autoscaler.signals import BelowResolution
from kvscale.controllers.autoscaling import ScalingInput, autoscale, calibration_status, previous_calibration
from kvscale.perfmodel import RequestShape, ServingSetup, build_replica_model, estimate_at_observed_load
from kvscale.planner import Candidate, build_plan_inputs, plan_deployment

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-3.1-70b-h100.yaml"


def _setup() -> ServingSetup:
    inputs = build_plan_inputs(load_resource(EXAMPLE).spec)
    chosen = plan_deployment(inputs).chosen
    assert chosen is not None
    return ServingSetup(inputs.arch, inputs.gpus[0], chosen.tensor_parallel, inputs.arch.native_precision)


def _planned() -> tuple[LLMDeploymentSpec, Candidate]:
    spec = load_resource(EXAMPLE).spec
    chosen = plan_deployment(build_plan_inputs(spec)).chosen
    assert chosen is not None
    return spec, chosen


def _windows(setup: ServingSetup) -> list[CalibrationSample]:
    """Windows of a server 1.3x slower than modelled whose prompts vary from window to window;
    one in three bursty (it teaches only the shape)."""
    model = build_replica_model(setup)
    samples = []
    for i in range(9):
        shape = RequestShape(800.0 + 300.0 * (i % 3), 200.0 + 20.0 * i, 3000.0 + 500.0 * (i % 2))
        seen = estimate_at_observed_load(model, shape, 8.0, 0.5)
        samples.append(CalibrationSample(shape=shape, quantile=0.95, running_per_replica=8.0, rate_per_replica=0.5,
                                         slots=64.0, tpot_mean_s=1.3 * seen.tpot_mean_s,
                                         prefill_mean_s=1.3 * seen.prefill_s, bursty=i % 3 == 0))
    return samples


def _through_status(calibration: Calibration) -> Calibration:
    status = LLMDeploymentStatus(calibration=calibration_status(calibration))
    # as the API server hands it back: serialized and parsed again
    return previous_calibration(LLMDeploymentStatus.model_validate(status.model_dump(by_alias=True)))


def test_calibration_through_status_matches_the_one_kept_in_memory() -> None:
    setup = _setup()
    in_memory = Calibration()  # the simulator's way
    via_status = Calibration()  # the operator's way: written to status, read back next cycle
    for sample in _windows(setup):
        in_memory = calibrate(in_memory, setup, sample)
        via_status = _through_status(calibrate(via_status, setup, sample))
    assert via_status.samples == in_memory.samples == 6  # the bursty windows fit no speed
    assert via_status.decode_factor == pytest.approx(in_memory.decode_factor, rel=1e-3)
    assert via_status.prefill_factor == pytest.approx(in_memory.prefill_factor, rel=1e-3)
    fallback = RequestShape(1.0, 1.0)
    kept, carried = in_memory.shape(fallback), via_status.shape(fallback)
    assert carried.input_tokens == pytest.approx(kept.input_tokens, abs=0.5)
    assert carried.output_tokens == pytest.approx(kept.output_tokens, abs=0.5)
    assert carried.input_tokens_tail == pytest.approx(kept.input_tokens_tail, abs=0.5)
    # and the shape really is smoothed across cycles, not the last window's
    last = _windows(setup)[-1].shape
    assert abs(carried.input_tokens - last.input_tokens) > 50


def test_a_shape_learned_only_from_bursts_leaves_the_first_speed_fit_trusted() -> None:
    setup = _setup()
    bursty, steady = _windows(setup)[0], _windows(setup)[1]
    assert bursty.bursty and not steady.bursty
    after_burst = _through_status(calibrate(Calibration(), setup, bursty))
    assert after_burst.samples == 0 and after_burst.input_tokens == pytest.approx(bursty.shape.input_tokens)
    # the first steady window sets the speed outright, as it would without the round trip
    fresh = calibrate(replace(Calibration(), input_tokens=after_burst.input_tokens,
                              output_tokens=after_burst.output_tokens,
                              input_tokens_tail=after_burst.input_tokens_tail), setup, steady)
    assert calibrate(after_burst, setup, steady).decode_factor == pytest.approx(fresh.decode_factor, rel=1e-3)
    assert fresh.decode_factor == pytest.approx(1 / 1.3, rel=0.15)


def test_a_status_written_before_the_shape_was_kept_still_reads() -> None:
    old = LLMDeploymentStatus.model_validate({"calibration": {"decodeFactor": 0.8, "prefillFactor": 0.9}})
    calibration = previous_calibration(old)
    assert calibration.decode_factor == 0.8 and calibration.samples == 1
    assert calibration.shape(RequestShape(512.0, 128.0)) == RequestShape(512.0, 128.0)


def test_the_operator_fits_speed_at_the_windows_mean_batch_not_one_instants() -> None:
    spec = load_resource(EXAMPLE).spec
    inputs = build_plan_inputs(spec)
    chosen = plan_deployment(inputs).chosen
    assert chosen is not None
    setup = _setup()
    now_s = 1_000_000.0
    model = build_replica_model(setup)
    shape = RequestShape(spec.workload.input_tokens, spec.workload.output_tokens)
    seen = estimate_at_observed_load(model, shape, 8.0, 0.5)  # 2 pods, 8 running on each on average

    def calibration_after(running_now: float, mean_running: float | None) -> Calibration:
        observation = Observation(
            sampled_at_s=now_s, pods_scraped=2, request_rate=1.0, mean_input_tokens=shape.input_tokens,
            mean_output_tokens=shape.output_tokens, running_requests=running_now, waiting_requests=0.0,
            kv_cache_usage=0.3, ttft_s=None, tpot_s=None, tpot_mean_s=1.3 * seen.tpot_mean_s,
            mean_running_requests=mean_running)
        result = autoscale(spec, setup, chosen, LLMDeploymentStatus(), None, 2, 2, None,
                           ScalingInput(observation, None, 1.3 * seen.prefill_s, ScalingHistory(), now_s),
                           datetime.fromtimestamp(now_s, UTC))
        return previous_calibration(result.status)

    # The window's batch was 8 per pod; the gauge happened to read 2 at the scrape, or 30.
    steady = calibration_after(16.0, 16.0)
    assert steady.decode_factor == pytest.approx(1 / 1.3, rel=0.15)
    for instant in (4.0, 60.0):
        assert calibration_after(instant, 16.0).decode_factor == pytest.approx(steady.decode_factor, rel=1e-3)
    # without the mean (an older exporter) the instant is all there is, and it misleads
    assert calibration_after(60.0, None).decode_factor != pytest.approx(steady.decode_factor, rel=0.05)


def test_status_shows_unserved_requests_and_what_the_histograms_cannot_resolve() -> None:
    spec, chosen = _planned()  # SLO TPOT 50 ms, TTFT 1000 ms
    now_s = 1_000_000.0
    observation = Observation(
        sampled_at_s=now_s, pods_scraped=1, request_rate=2.0, mean_input_tokens=200, mean_output_tokens=40,
        running_requests=3.5, waiting_requests=0.0, kv_cache_usage=0.1, ttft_s=0.04, tpot_s=None,
        tpot_mean_s=0.004, aborted_rate=0.25, failed_rate=0.05, prefill_quantile_s=None,
        below_resolution=(BelowResolution("tpot_s", 0.01), BelowResolution("prefill_quantile_s", 0.3)))
    result = autoscale(spec, _setup(), chosen, LLMDeploymentStatus(), None, 1, 1, None,
                       ScalingInput(observation, None, 0.017, ScalingHistory(), now_s),
                       datetime.fromtimestamp(now_s, UTC))
    observed = result.status.observed
    assert observed is not None
    assert (observed.aborted_per_second, observed.failed_per_second, observed.requests_per_second) == (0.25, 0.05, 2.0)
    assert observed.tpot_at_slo_percentile_ms is None and observed.tpot_mean_ms == 4.0
    # the latency at the SLO percentile, under its name, its deprecated name, and as the headline column
    assert observed.ttft_at_slo_percentile_ms == observed.ttft_p95_ms == 40.0
    assert result.status.ttft_at_slo_percentile_ms == result.status.ttft_p95_ms == 40.0
    assert observed.below_resolution == ["TPOT <= 10 ms (the histogram's first bucket)",
                                         "prefill time <= 300 ms (the histogram's first bucket)"]
    # p95 TPOT is at most 10 ms against an SLO of 50: met, although the percentile itself is unknown
    assert result.status.slo_met is True
    assert observed.within_slo_pct is None  # no histograms read: no share within the SLOs


def test_status_reports_the_share_of_requests_within_the_slos() -> None:
    spec, chosen = _planned()
    assert (spec.slo.ttft_ms, spec.slo.tpot_ms) == (1000, 40)
    now_s = 1_000_000.0
    # per second over the window: 2 requests, 0.1 of them past 1 s TTFT, 0.04 past 40 ms TPOT
    observation = Observation(
        sampled_at_s=now_s, pods_scraped=1, request_rate=2.0, mean_input_tokens=200, mean_output_tokens=40,
        running_requests=3.5, waiting_requests=0.0, kv_cache_usage=0.1, ttft_s=0.9, tpot_s=0.035,
        ttft_buckets=((0.5, 1.5), (1.0, 1.9), (2.5, 2.0), (math.inf, 2.0)),
        tpot_buckets=((0.025, 1.0), (0.04, 1.96), (math.inf, 2.0)))
    result = autoscale(spec, _setup(), chosen, LLMDeploymentStatus(), None, 1, 1, None,
                       ScalingInput(observation, None, 0.017, ScalingHistory(), now_s),
                       datetime.fromtimestamp(now_s, UTC))
    observed = result.status.observed
    assert observed is not None and observed.within_slo_pct == pytest.approx(100.0 * (1 - 0.05 - 0.02))
    wire = LLMDeploymentStatus.model_validate(result.status.model_dump(by_alias=True))  # through the API server
    assert wire.observed is not None and wire.observed.within_slo_pct == observed.within_slo_pct


def test_status_reports_the_measured_startup_and_the_forecast_it_sized_for() -> None:
    spec, chosen = _planned()
    now_s = 1_000_000.0
    observation = Observation(
        sampled_at_s=now_s, pods_scraped=2, request_rate=2.0, mean_input_tokens=200, mean_output_tokens=40,
        running_requests=3.5, waiting_requests=0.0, kv_cache_usage=0.1, ttft_s=0.04, tpot_s=0.01)
    result = autoscale(spec, _setup(), chosen, LLMDeploymentStatus(), None, 2, 2, None,
                       ScalingInput(observation, None, 0.017, ScalingHistory(), now_s, decision_interval_s=30.0),
                       datetime.fromtimestamp(now_s, UTC), [("chat-0", 200.0), ("chat-1", 400.0)])
    startup, forecast = result.status.startup, result.status.forecast
    assert startup is not None and startup.p90_seconds == pytest.approx(380.0)
    # the horizon is the measured start-up plus one decision, in whole minutes
    assert forecast is not None and forecast.horizon_seconds == pytest.approx(420.0)
    assert forecast.forecaster == "last-value" and forecast.scored_minutes == 0
    assert {b.forecaster for b in forecast.backtest} == {"last-value", "holt-winters", "burst-envelope"}
    # both survive the round trip through the API server, and the next cycle builds on them
    again = LLMDeploymentStatus.model_validate(result.status.model_dump(by_alias=True))
    later = autoscale(spec, _setup(), chosen, again, again, 2, 2, None,
                      ScalingInput(observation, None, 0.017, result.decision.history, now_s + 30),
                      datetime.fromtimestamp(now_s + 30, UTC), [("chat-2", 100.0)])
    assert later.status.startup is not None and [p.pod for p in later.status.startup.recent] == [
        "chat-0", "chat-1", "chat-2"]

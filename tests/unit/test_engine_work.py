"""Speed from the engine's own work counters (vLLM's MFU metrics), and the fallback without them.

The synthetic server below is the model at known efficiency factors; its counters count work the way
vLLM's do (kvscale never reads them back from the model): every step streams the weights and the KV
cache of the running sequences, and every token costs the linear layers' FLOPs plus its attention.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvscale.api.spec import Precision, load_resource
from kvscale.api.status import LLMDeploymentStatus, SpeedFitSource
from kvscale.autoscaler import Calibration, CalibrationSample, Observation, ReplicaContext, calibrate
from kvscale.autoscaler.engine_work import EngineWork, estimate_achieved_speeds
from kvscale.autoscaler.policy import build_calibration_sample
from kvscale.catalog import find_gpu, resolve_architecture
from kvscale.controllers.autoscaling import calibration_status, previous_calibration
from kvscale.perfmodel import (
    ReplicaModel,
    RequestShape,
    ServingSetup,
    build_replica_model,
    estimate_at_observed_load,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-3.1-70b-h100.yaml"
TRUE_DECODE, TRUE_PREFILL = 0.7, 1.3  # the synthetic server against the model's defaults
BUSY = 0.8  # share of the window the engine was stepping


def _setup() -> ServingSetup:
    return ServingSetup(resolve_architecture("meta-llama/Llama-3.1-8B-Instruct"), find_gpu("H100-SXM"), 1,
                        Precision.BF16)


def _server(setup: ServingSetup) -> ReplicaModel:
    return build_replica_model(replace(setup, efficiency=setup.efficiency.scaled(decode=TRUE_DECODE,
                                                                               prefill=TRUE_PREFILL)))


def _mean_step_s(server: ReplicaModel, shape: RequestShape, running: float, prompt_tokens_per_step: float) -> float:
    """The server's mean step: decode-only steps, and steps carrying a chunk of at least one prompt."""
    room = server.setup.token_budget - running
    chunk = min(room, max(shape.input_tokens, prompt_tokens_per_step))
    share = min(prompt_tokens_per_step / chunk, 1.0)
    ctx = shape.mean_context_tokens
    decode = float(server.step_s(running, ctx))
    with_chunk = float(server.step_s(running, ctx, chunk, chunk * shape.input_tokens / 2.0, chunk / shape.input_tokens))
    return share * with_chunk + (1.0 - share) * decode


def _window(setup: ServingSetup, shape: RequestShape, running: float, rate: float) -> CalibrationSample:
    """One window of the synthetic server, busy BUSY of the time, with its counters and latencies."""
    server = _server(setup)
    steps_per_s = 100.0
    for _ in range(60):  # steps/s and the prompt tokens each step carries settle together
        mean_step_s = _mean_step_s(server, shape, running, rate * shape.input_tokens / steps_per_s)
        steps_per_s = BUSY / mean_step_s
    prompt_per_step = rate * shape.input_tokens / steps_per_s
    arch = setup.arch
    bytes_per_step = (server.always_read_bytes
                      + running * shape.mean_context_tokens * server.kv_bytes_per_token_per_layer * arch.num_layers)
    flops_per_step = ((running + prompt_per_step) * server.linear_flops_per_token
                      + prompt_per_step * shape.input_tokens / 2.0 * server.attention_flops_per_token_pair)
    work = EngineWork(flops_per_s=flops_per_step * steps_per_s, hbm_bytes_per_s=bytes_per_step * steps_per_s,
                      steps_per_s=steps_per_s)
    prefill_s = estimate_at_observed_load(server, shape, running, rate).prefill_s
    return CalibrationSample(shape=shape, quantile=0.95, running_per_replica=running, rate_per_replica=rate,
                             slots=256.0, tpot_mean_s=BUSY / steps_per_s, prefill_mean_s=prefill_s, engine_work=work)


def _fitted(setup: ServingSetup, sample: CalibrationSample, windows: int = 15) -> Calibration:
    calibration = Calibration()
    for _ in range(windows):
        calibration = calibrate(calibration, setup, sample)
    return calibration


DECODE_HEAVY = (RequestShape(500.0, 300.0), 16.0, 2.7)  # chat: decode steps take 96% of the time
PREFILL_HEAVY = (RequestShape(2000.0, 20.0), 4.0, 12.0)  # summarisation: prompt chunks take 60%


def test_the_counters_recover_the_bandwidth_a_decode_heavy_server_achieved() -> None:
    setup = _setup()
    sample = _window(setup, *DECODE_HEAVY)
    calibration = _fitted(setup, sample)
    assert calibration.speed_fit_from == SpeedFitSource.ENGINE_COUNTERS
    # within the KV cache's share: the defaults stream it at another fraction of peak than the weights
    assert calibration.decode_factor == pytest.approx(TRUE_DECODE, rel=0.02)
    achieved = calibration.achieved_hbm_bandwidth_bytes_per_s
    weights_efficiency = setup.efficiency.hbm_bandwidth
    assert achieved == pytest.approx(TRUE_DECODE * weights_efficiency * setup.gpu.hbm_bandwidth_bytes_per_s, rel=0.02)
    assert calibration.achieved_flops_per_s is None  # prompt chunks take too little of the time to tell
    assert calibration.prefill_factor == pytest.approx(TRUE_PREFILL, rel=0.02)  # from the prefill times


def test_the_counters_recover_the_compute_a_prefill_heavy_server_achieved() -> None:
    setup = _setup()
    calibration = _fitted(setup, _window(setup, *PREFILL_HEAVY))
    assert calibration.speed_fit_from == SpeedFitSource.ENGINE_COUNTERS
    assert calibration.prefill_factor == pytest.approx(TRUE_PREFILL, rel=0.02)
    model = build_replica_model(setup)
    assert calibration.achieved_flops_per_s == pytest.approx(
        TRUE_PREFILL * setup.efficiency.compute * model.linear_flops_per_s, rel=0.02)
    assert calibration.achieved_hbm_bandwidth_bytes_per_s is None  # decode steps take too little of the time


def test_at_the_true_speed_one_window_measures_it() -> None:
    setup = _setup()
    server = _server(setup)
    for shape, running, rate in (DECODE_HEAVY, PREFILL_HEAVY):
        sample = _window(setup, shape, running, rate)
        assert sample.engine_work is not None and sample.tpot_mean_s is not None
        achieved = estimate_achieved_speeds(server, shape, running, rate, sample.tpot_mean_s, sample.engine_work)
        if achieved.hbm_bandwidth_bytes_per_s is not None:
            assert achieved.hbm_bandwidth_bytes_per_s == pytest.approx(
                TRUE_DECODE * setup.efficiency.hbm_bandwidth * setup.gpu.hbm_bandwidth_bytes_per_s, rel=0.02)
        if achieved.flops_per_s is not None:
            assert achieved.flops_per_s == pytest.approx(
                TRUE_PREFILL * setup.efficiency.compute * server.linear_flops_per_s, rel=0.02)
        assert (achieved.hbm_bandwidth_bytes_per_s is None) != (achieved.flops_per_s is None)


def test_work_per_wall_second_alone_says_nothing_of_speed() -> None:
    # The same work in as many steps, each half as long (an engine idle 60% of the time, not 20%): the
    # counters read the same, the bandwidth is more than twice (the steps' fixed part did not shrink).
    setup = _setup()
    shape, running, rate = DECODE_HEAVY
    sample = _window(setup, shape, running, rate)
    assert sample.engine_work is not None and sample.tpot_mean_s is not None
    model = build_replica_model(setup)
    busy = estimate_achieved_speeds(model, shape, running, rate, sample.tpot_mean_s, sample.engine_work)
    idler = estimate_achieved_speeds(model, shape, running, rate, sample.tpot_mean_s / 2, sample.engine_work)
    assert busy.hbm_bandwidth_bytes_per_s is not None and idler.hbm_bandwidth_bytes_per_s is not None
    assert idler.hbm_bandwidth_bytes_per_s > 2 * busy.hbm_bandwidth_bytes_per_s


def test_without_the_counters_the_latency_fit_is_unchanged() -> None:
    setup = _setup()
    with_counters = _window(setup, *DECODE_HEAVY)
    without = replace(with_counters, engine_work=None)
    calibration = _fitted(setup, without)
    assert calibration.speed_fit_from == SpeedFitSource.LATENCIES
    assert calibration.achieved_hbm_bandwidth_bytes_per_s is None and calibration.achieved_flops_per_s is None
    # the latency fit itself: the TPOT's ratio to the model's, as before the counters existed
    first = calibrate(Calibration(), setup, without)
    prefill = calibrate(Calibration(), setup, replace(without, tpot_mean_s=None)).prefill_factor
    with_prefill = build_replica_model(replace(setup, efficiency=setup.efficiency.scaled(prefill=prefill)))
    seen = estimate_at_observed_load(with_prefill, without.shape, without.running_per_replica,
                                     without.rate_per_replica or 0.0)
    assert without.tpot_mean_s is not None
    assert first.decode_factor == pytest.approx(seen.tpot_mean_s / without.tpot_mean_s, rel=1e-12)


@pytest.mark.parametrize("missing", ["tpot", "idle", "bursty"])
def test_counters_teach_no_speed_where_the_window_cannot(missing: str) -> None:
    setup = _setup()
    sample = _window(setup, *DECODE_HEAVY)
    if missing == "tpot":  # no step time to set the work against
        sample = replace(sample, tpot_mean_s=None, prefill_mean_s=None)
    elif missing == "idle":
        sample = replace(sample, running_per_replica=0.0, prefill_mean_s=None)
    else:
        sample = replace(sample, bursty=True)
    calibration = calibrate(Calibration(), setup, sample)
    assert calibration.decode_factor == 1.0 and calibration.achieved_hbm_bandwidth_bytes_per_s is None


def test_the_counter_fit_survives_the_status_round_trip() -> None:
    setup = _setup()
    calibration = _fitted(setup, _window(setup, *DECODE_HEAVY), windows=3)
    status = calibration_status(calibration)
    assert status.speed_fit_from == SpeedFitSource.ENGINE_COUNTERS
    assert calibration.achieved_hbm_bandwidth_bytes_per_s is not None
    assert status.achieved_hbm_bandwidth_gbps == pytest.approx(calibration.achieved_hbm_bandwidth_bytes_per_s / 1e9,
                                                               abs=0.05)
    wire = LLMDeploymentStatus(calibration=status).model_dump(by_alias=True, exclude_none=True)["calibration"]
    assert wire["speedFitFrom"] == "engine-counters" and "achievedHbmBandwidthGbps" in wire
    back = previous_calibration(LLMDeploymentStatus.model_validate({"calibration": wire}))
    assert back.speed_fit_from == SpeedFitSource.ENGINE_COUNTERS
    assert back.achieved_hbm_bandwidth_bytes_per_s == pytest.approx(calibration.achieved_hbm_bandwidth_bytes_per_s,
                                                                    rel=1e-3)


def test_the_prefix_cache_hit_rate_is_smoothed_like_the_shape() -> None:
    setup = _setup()
    sample = replace(_window(setup, *DECODE_HEAVY), bursty=True)  # the shape is learned from any window
    fallback = RequestShape(500.0, 300.0, prefix_cache_hit_rate=0.25)  # the spec's expectation
    assert Calibration().shape(fallback).prefix_cache_hit_rate == 0.25
    never = calibrate(Calibration(), setup, sample)  # an engine that exports no prefix-cache counters
    assert never.prefix_cache_hit_rate is None and never.shape(fallback).prefix_cache_hit_rate == 0.25
    calibration = Calibration()
    for hit_rate in (0.6, 0.6, 0.0):
        calibration = calibrate(calibration, setup, replace(sample, prefix_cache_hit_rate=hit_rate))
    assert calibration.prefix_cache_hit_rate == pytest.approx(0.7 * 0.6)  # one window of 0 moves it 30%
    assert calibration.shape(fallback).prefix_cache_hit_rate == pytest.approx(0.42)
    assert previous_calibration(LLMDeploymentStatus(calibration=calibration_status(calibration))
                                ).prefix_cache_hit_rate == pytest.approx(0.42)


def _observation(**fields: Any) -> Observation:
    return Observation(sampled_at_s=1000.0, pods_scraped=2, request_rate=4.0, mean_input_tokens=500.0,
                       mean_output_tokens=300.0, running_requests=20.0, waiting_requests=0.0, kv_cache_usage=0.3,
                       ttft_s=None, tpot_s=None, tpot_mean_s=0.02, mean_running_requests=20.0, **fields)


def test_the_policy_hands_the_observed_counters_and_hit_rate_to_calibration() -> None:
    spec = load_resource(EXAMPLE).spec
    context = ReplicaContext(spec=spec, setup=_setup(), max_num_seqs=64, kv_cache_tokens=100_000,
                             current_replicas=2, ready_replicas=2, free_replica_slots=None)
    bare = build_calibration_sample(context, _observation(), prefill_mean_s=None)
    assert bare.engine_work is None and bare.prefix_cache_hit_rate is None
    assert bare.shape.prefix_cache_hit_rate == 0.0  # the spec's expectation
    counted = build_calibration_sample(context, _observation(
        prefix_cache_hit_rate=0.4, estimated_flops_per_s_per_gpu=2e14, estimated_read_bytes_per_s_per_gpu=1e12,
        estimated_write_bytes_per_s_per_gpu=1e10, engine_steps_per_s=50.0), prefill_mean_s=None)
    assert counted.prefix_cache_hit_rate == counted.shape.prefix_cache_hit_rate == 0.4
    # already per GPU of one engine: not divided by the pods again, unlike the request rate
    assert counted.engine_work == EngineWork(flops_per_s=2e14, hbm_bytes_per_s=1.01e12, steps_per_s=50.0)
    assert counted.rate_per_replica == 2.0
    # a counter the engine does not export leaves the latency fit
    partial = build_calibration_sample(context, _observation(estimated_flops_per_s_per_gpu=2e14,
                                                             engine_steps_per_s=50.0), prefill_mean_s=None)
    assert partial.engine_work is None

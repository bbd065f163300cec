"""The latency distributions under load: the helpers against closed forms, the model's shape against
what queueing says it must do (monotone in load, short requests set the TPOT tail, a lone client
never queues, prefix hits cut the prefill)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvscale.api.spec import Precision
from kvscale.catalog import find_gpu, resolve_architecture
from kvscale.perfmodel import (
    RequestShape,
    ServingSetup,
    build_replica_model,
    estimate_at_concurrency,
    estimate_at_rate,
    estimate_goodput,
)
from kvscale.perfmodel.distributions import (
    gamma_sf,
    lognormal_strata,
    normal_sf,
    percentile_strata,
    quantile_by_bisection,
)
from kvscale.perfmodel.latency import output_interval_strata, tpot_quantile_s
from kvscale.perfmodel.serving import first_wave_ttft_mean_s, run_ttft_mean_s


def _model(gpu: str = "H100-SXM"):  # type: ignore[no-untyped-def]
    return build_replica_model(ServingSetup(resolve_architecture("llama-3.1-8b"), find_gpu(gpu), 1, Precision.BF16))


def test_normal_and_gamma_tails_match_closed_forms() -> None:
    assert float(normal_sf(1.6448536)) == pytest.approx(0.05, abs=1e-6)
    assert float(normal_sf(-1.0)) == pytest.approx(1 - 0.1586553, abs=1e-6)
    # A gamma of variance mean² is an exponential: its tail is exp(-x / mean), to a few percent.
    for x in (0.5, 1.0, 3.0):
        assert float(gamma_sf(x, 1.0, 1.0)) == pytest.approx(math.exp(-x), rel=0.06)


def test_only_a_first_prompt_opens_a_request_to_the_prompts_behind_it() -> None:
    """Requests of 6 tokens (5 decode steps of 12 ms), prompts of 300 ms of chunks. Prompts that arrive
    while a prompt's chunks run queue behind it, so they reach a request only once a prompt that arrived
    in its undisturbed steps, or during its TTFT, disturbs it."""
    lengths = ((0.01, 6.0), (0.5, 6.0), (0.99, 6.0))

    def p99_s(rate: float, queued_window_s: float) -> float:
        return float(tpot_quantile_s(np.array(0.012), np.array(0.0), np.array(0.013), np.array(0.14),
                                     np.array(rate), np.array(queued_window_s), np.array([0.3]), np.array([1.0]),
                                     6.0, None, 0.99, lengths))

    # 0.1 prompts/s over 60 ms of undisturbed decoding: 0.6% of requests see one, fewer than the 1% the
    # p99 leaves, so the p99 is an undisturbed step (counting arrivals over a 40 ms-TPOT life put it at 40+).
    assert p99_s(0.1, 0.0) == pytest.approx(0.012, rel=0.02)
    # Half a second of TTFT queues 5% of requests behind a prompt: now the p99 carries one.
    assert p99_s(0.1, 0.5) > 0.05
    assert p99_s(0.3, 0.0) > 0.04  # 1.8% disturbed while decoding


def test_the_batch_a_long_request_finds_spreads_its_tpot() -> None:
    """Without prompts, a request of 500 fixed outputs at 20 ms a step shares its life (10 s) with a batch
    whose step time varies by 2 ms and relaxes in 10 s: of that, (1 - 1/e) stays on average over its life,
    so its p95 TPOT is the step plus 1.645 x 2 ms x 0.632; without the spread, the step itself."""
    lengths = ((0.01, 500.0), (0.5, 500.0), (0.99, 500.0))

    def p95_s(batch_sd_s: float) -> float:
        return float(tpot_quantile_s(np.array(0.02), np.array(0.0), np.array(0.02), np.array(0.1), np.array(0.0),
                                     np.array(0.0), np.array([0.1]), np.array([1.0]), 500.0, None, 0.95, lengths,
                                     batch_sd_s, 499 * 0.02))

    assert p95_s(0.0) == pytest.approx(0.02, rel=1e-3)
    assert p95_s(0.002) == pytest.approx(0.02 + 1.6449 * 0.002 * (1 - math.exp(-1.0)), rel=2e-3)


def test_an_open_loops_batch_varies_and_a_closed_loops_does_not() -> None:
    """Long fixed outputs, long contexts (each sequence adds 0.27 ms of attention to a 22 ms step) and
    prompts mostly served from the prefix cache: prompts barely move a 400-step request, so its TPOT spread
    under Poisson arrivals is mostly the batch's (Poisson about its mean, widened by its feedback on
    itself); a closed loop of as many clients keeps its batch and has a narrow spread."""
    model = _model()
    shape = RequestShape(6000, 400, prefix_cache_hit_rate=0.97,
                         output_percentiles=((0.01, 400.0), (0.5, 400.0), (0.99, 400.0)))
    open_loop = estimate_at_rate(model, shape, 6.0, 1024.0, 0.95)
    closed_loop = estimate_at_concurrency(model, shape, float(open_loop.running_seqs), 0.95)
    slope_s = float(model.step_s(np.array(float(open_loop.running_seqs) + 1.0), shape.mean_context_tokens)[()]
                    - open_loop.decode_step_s)
    open_spread_s = float(open_loop.tpot_quantile_s - open_loop.tpot_mean_s)
    assert open_spread_s > 1.6449 * slope_s * math.sqrt(float(open_loop.running_seqs)) * 0.5
    assert float(closed_loop.tpot_quantile_s - closed_loop.tpot_mean_s) < 0.5 * open_spread_s


def test_decoders_hold_a_whole_mean_output_when_lengths_are_geometric() -> None:
    """A request of n outputs decodes in n steps, so the steps' sequences hold E[n(n-1)]/2E[n] outputs:
    half the mean for fixed lengths (and when only the means are known), the mean for geometric ones."""
    means_only = RequestShape(1000, 256)
    assert means_only.mean_context_tokens == pytest.approx(1128)
    fixed = replace(means_only, output_percentiles=((0.01, 256.0), (0.5, 256.0), (0.99, 256.0)))
    assert fixed.mean_context_tokens == pytest.approx(1000 + 255 / 2, abs=1.0)
    geometric = replace(means_only, output_percentiles=tuple(
        (p, -256.0 * math.log(1 - p)) for p in (0.05, 0.25, 0.5, 0.75, 0.95, 0.99)))
    assert geometric.mean_context_tokens == pytest.approx(1000 + 256, rel=0.03)


def test_a_mix_of_prompt_lengths_costs_the_decodes_more_than_its_mean_prompt() -> None:
    """A step's time is convex in its prompt tokens (a few ride under the decode's weight reads): with
    prompts rarer than one a step, exponential-like lengths slow the mean step more than prompts all of
    the mean length; the batch still grows smoothly with the rate (no runaway near the goodput)."""
    from kvscale.perfmodel.serving import _mean_step

    model = _model()
    fixed = RequestShape(512, 256)
    mixed = RequestShape.with_assumed_tail(512, 256, 0.95)
    running = np.array([40.0])
    decode = float(_mean_step(model, fixed, running)[1][0])
    extra_fixed = float(_mean_step(model, fixed, running)[0][0]) - decode
    extra_mixed = float(_mean_step(model, mixed, running)[0][0]) - decode
    assert extra_mixed > 1.03 * extra_fixed
    # Charged per prompt where several share a step, the mix once ran away past 19.6 req/s here: the
    # batch leapt from 87 to 202 sequences in 0.1 req/s. The increments now grow by at most 2% a step.
    shape = RequestShape.with_assumed_tail(1024, 200, 0.95)
    at = estimate_at_rate(model, shape, np.arange(15.0, 21.0, 0.05), 256.0, 0.95)
    assert np.all(at.stable)
    growth = np.diff(at.running_seqs)
    assert np.all(growth > 0)
    assert np.max(growth[1:] / growth[:-1]) < 1.5


def test_length_strata_keep_the_mean_and_the_stated_percentiles() -> None:
    values, weights = lognormal_strata(1000.0, 3000.0, 0.95)
    assert float(np.dot(values, weights)) == pytest.approx(1000.0)
    assert float(weights.sum()) == pytest.approx(1.0)
    assert float(weights[values < 3000.0].sum()) == pytest.approx(0.95, abs=0.03)
    alike, one = lognormal_strata(1000.0, 1000.0, 0.95)
    assert alike.tolist() == [1000.0] and one.tolist() == [1.0]

    values, weights = percentile_strata(((0.5, 1000.0), (0.9, 2700.0), (0.99, 4100.0)))
    assert float(weights[values <= 1000.0].sum()) == pytest.approx(0.5, abs=0.08)
    assert float(weights[values <= 4100.0].sum()) == pytest.approx(0.99, abs=0.01)
    assert np.all(np.diff(values) >= 0)


def test_output_strata_reach_the_short_requests_that_set_the_tpot_tail() -> None:
    intervals, weights = output_interval_strata(200.0, None)
    assert float(weights.sum()) == pytest.approx(1.0)
    assert float(intervals.min()) <= 2.0  # geometric: 1 in 200 requests ends within two tokens
    assert float(np.dot(intervals, weights)) == pytest.approx(199.0, rel=0.08)


def test_bisection_finds_the_quantile_of_an_exponential() -> None:
    def survival(t: np.ndarray) -> np.ndarray:
        return np.exp(-np.asarray(t) / 2.0)

    assert float(quantile_by_bisection(survival, 0.95, np.array(0.0), np.array(100.0))) == pytest.approx(
        2.0 * math.log(20.0), rel=1e-5)


def test_a_lone_client_never_queues_and_more_clients_queue_more() -> None:
    model = _model()
    shape = RequestShape(2048, 256)
    alone = estimate_at_concurrency(model, shape, 1.0, 0.95)
    assert float(alone.prefill_wait_mean_s) == pytest.approx(0.0, abs=1e-9)
    outside_the_engine_s = model.setup.efficiency.ttft_overhead_s(model.arch.num_layers)
    assert float(alone.ttft_mean_s) == pytest.approx(float(model.prefill_s(2048)) + outside_the_engine_s, rel=0.05)
    sweep = estimate_at_concurrency(model, shape, np.array([1.0, 8.0, 32.0, 128.0]), 0.95)
    assert np.all(np.diff(sweep.ttft_mean_s) > 0)
    assert np.all(np.diff(sweep.ttft_quantile_s) > 0)
    assert np.all(sweep.ttft_quantile_s >= sweep.ttft_mean_s)
    # TTFT rises with concurrency far more than the prefill of one prompt does (issue 13's complaint).
    assert float(sweep.ttft_mean_s[3]) > 1.5 * float(sweep.ttft_mean_s[0])


def test_open_loop_latencies_rise_with_the_arrival_rate() -> None:
    model = _model()
    shape = RequestShape.with_assumed_tail(1024, 256, 0.95)
    rates = np.array([1.0, 5.0, 10.0, 15.0])
    at = estimate_at_rate(model, shape, rates, 256.0, 0.95)
    assert np.all(at.stable)
    for series in (at.ttft_mean_s, at.ttft_quantile_s, at.tpot_mean_s, at.tpot_quantile_s):
        assert np.all(np.diff(series) > 0)
    assert np.all(at.tpot_quantile_s > at.tpot_mean_s)


def test_bursty_arrivals_lengthen_the_prefill_wait_by_kingmans_factor() -> None:
    model = _model()
    shape = RequestShape.with_assumed_tail(4096, 64, 0.95)  # long prompts: the prefill queue sets the TTFT
    rates = np.array([1.0, 3.0, 6.0])  # saturation: 7.8 req/s
    poisson = estimate_at_rate(model, shape, rates, 256.0, 0.99)
    assert np.all(poisson.stable)
    np.testing.assert_array_equal(estimate_at_rate(model, shape, rates, 256.0, 0.99, arrival_scv=1.0).ttft_quantile_s,
                                  poisson.ttft_quantile_s)
    twice, thrice = (estimate_at_rate(model, shape, rates, 256.0, 0.99, arrival_scv=scv) for scv in (2.0, 3.0))
    added = thrice.prefill_wait_mean_s - poisson.prefill_wait_mean_s
    # Only the queue's wait grows, (c_a^2 - 1) / (1 + c_s^2) times the M/G/1 wait: linearly in c_a^2, at most
    # (c_a^2 - 1) times the Poisson wait, and more the busier the queue.
    np.testing.assert_allclose(twice.prefill_wait_mean_s - poisson.prefill_wait_mean_s, added / 2.0, rtol=1e-9)
    assert np.all(added > 0.0) and np.all(added <= 2.0 * poisson.prefill_wait_mean_s)
    assert np.all(np.diff(added) > 0.0) and np.all(thrice.ttft_quantile_s > poisson.ttft_quantile_s)
    np.testing.assert_array_equal(thrice.decode_step_s, poisson.decode_step_s)
    # A lower goodput where the TTFT binds.
    goodputs = [float(estimate_goodput(model, shape, [256.0], 1.0, 0.1, 0.99, scv).request_rate[0])
                for scv in (1.0, 1.25, 2.0)]
    assert goodputs[0] > goodputs[1] > goodputs[2] > 0.0


def test_short_outputs_widen_the_tpot_tail() -> None:
    model = _model()
    common = RequestShape(2048, 200, output_percentiles=((0.5, 200.0), (0.9, 260.0)))
    skewed = replace(common, output_percentiles=((0.1, 5.0), (0.5, 60.0), (0.9, 500.0)))
    rate = 4.0
    assert float(estimate_at_rate(model, skewed, rate, 256.0, 0.99).tpot_quantile_s) > 1.2 * float(
        estimate_at_rate(model, common, rate, 256.0, 0.99).tpot_quantile_s)


def test_prefix_cache_hits_cut_the_prefill_and_the_kv_a_request_holds() -> None:
    from kvscale.perfmodel.serving import concurrency_limit

    model = _model("L40S")
    cold = RequestShape(4096, 256)
    warm = replace(cold, prefix_cache_hit_rate=0.75)
    assert warm.computed_input_tokens == pytest.approx(1024)
    rate = 2.0
    cold_at, warm_at = (estimate_at_rate(model, s, rate, 64.0, 0.95) for s in (cold, warm))
    assert float(warm_at.ttft_quantile_s) < 0.5 * float(cold_at.ttft_quantile_s)
    assert float(warm_at.tpot_quantile_s) < float(cold_at.tpot_quantile_s)
    assert float(concurrency_limit(warm, 1000, 100_000)) > 2 * float(concurrency_limit(cold, 1000, 100_000))


def test_a_closed_loops_first_wave_queues_for_the_token_budget() -> None:
    model = _model()
    shape = RequestShape(2048.0, 256.0)
    budget = float(model.setup.token_budget)
    alone = first_wave_ttft_mean_s(model, shape, 1)
    assert alone == pytest.approx(float(model.prefill_s(2048.0)) + model.setup.efficiency.ttft_overhead_s(
        model.arch.num_layers), rel=0.05)
    # The k-th of C prompts sent at once is prefilled after about (k + 1) x 2048 / budget full steps: the mean
    # grows about linearly with C, well beyond one prompt's prefill.
    waves = [first_wave_ttft_mean_s(model, shape, clients) for clients in (4, 16, 64)]
    assert waves[0] < waves[1] < waves[2]
    assert waves[2] > 64 * 2048 / budget / 2 * float(model.prefill_s(min(2048.0, budget)))
    steady = float(estimate_at_concurrency(model, shape, 64.0, quantile=0.5).ttft_mean_s)
    # A run's mean: the wave's C requests at the wave's mean, the rest at the steady state's.
    assert run_ttft_mean_s(model, shape, 64, 64, steady) == pytest.approx(waves[2])
    assert run_ttft_mean_s(model, shape, 64, 640, steady) == pytest.approx((64 * waves[2] + 576 * steady) / 640)
    assert run_ttft_mean_s(model, shape, 64, 1e9, steady) == pytest.approx(steady, rel=1e-3)


def test_the_first_wave_term_matches_the_step_level_simulator() -> None:
    # kvscale.sim.benchserve schedules the same C prompts step by step (chunks, decodes taking budget): what
    # the first C requests add to a run's mean TTFT there is what first_wave_ttft_mean_s adds to the model's.
    from kvscale.api.spec import load_resource
    from kvscale.planner import build_plan_inputs
    from kvscale.sim.benchserve import run_closed_loop
    from kvscale.sim.deployment import build_simulated_deployment
    from kvscale.sim.trace import Trace

    spec = load_resource(Path(__file__).resolve().parents[2] / "examples" / "llama-3.1-70b-h100.yaml").spec
    spec = spec.model_copy(update={
        "slo": spec.slo.model_copy(update={"ttft_ms": 20_000.0}),
        "workload": spec.workload.model_copy(update={"input_tokens": 4096, "output_tokens": 256,
                                                    "requests_per_second": 1.0}),
        "serving": spec.serving.model_copy(update={"tensor_parallel": 4, "max_num_seqs": 64})})
    inputs = build_plan_inputs(spec)
    deployment = build_simulated_deployment(inputs, server_efficiency=inputs.efficiency)
    clients, requests = 16, 160
    lengths = np.full(requests, 4096, dtype=np.int64)
    trace = Trace("fixed", np.zeros(requests), lengths, np.full(requests, 256, dtype=np.int64), 1.0)
    counted = run_closed_loop(deployment, trace, clients, requests, warmup=0).ttft_s
    simulated_wave_s = float(np.mean(counted[:clients]))  # the first C requests, sent at once
    model = build_replica_model(deployment.setup)
    modelled_wave_s = first_wave_ttft_mean_s(model, RequestShape(4096.0, 256.0), clients)
    assert modelled_wave_s == pytest.approx(simulated_wave_s, rel=0.15)

"""The fleet simulator: closed forms at low load, unbounded queues in overload, exact step times,
traces, the HPA baselines, and kvscale's own policy function called unchanged."""

from __future__ import annotations

import gzip
import importlib
import itertools
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import kvscale.autoscaler
import kvscale.sim.policies
from kvscale.api.spec import load_resource
from kvscale.catalog import find_gpu, resolve_architecture
from kvscale.cli.simulate_cmd import run_simulation
from kvscale.errors import InvalidSpecError
from kvscale.perfmodel import ServingSetup, build_replica_model
from kvscale.planner import build_plan_inputs
from kvscale.sim import (
    AZURE_ATTRIBUTION,
    FleetConfig,
    SimulatedDeployment,
    Trace,
    build_policy,
    build_simulated_deployment,
    generate_synthetic_trace,
    parse_trace_csv,
    simulate,
)
from kvscale.sim.loadtest import load_test_capacity, measure_at_rate
from kvscale.sim.observe import REQUEST_LATENCY_BUCKETS_S, WindowStats, histogram_percentile
from kvscale.sim.policies import FleetState, HpaPolicy, KvscalePolicy, StaticPolicy
from kvscale.sim.server import MEASURED_LIKE_FORM, SERVER_FORMS, ServerForm, StepCost

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "kvscale"
EXAMPLE = ROOT / "examples" / "llama-3.1-8b-l4.yaml"


@pytest.fixture(scope="module")
def deployment() -> SimulatedDeployment:
    return build_simulated_deployment(build_plan_inputs(load_resource(EXAMPLE).spec))


def _fixed_trace(arrivals: list[float], prompt: int, output: int, duration_s: float) -> Trace:
    n = len(arrivals)
    return Trace(name="fixed", arrival_s=np.array(arrivals, dtype=np.float64),
                 input_tokens=np.full(n, prompt, dtype=np.int64), output_tokens=np.full(n, output, dtype=np.int64),
                 duration_s=duration_s)


def test_one_server_at_a_trickle_matches_the_model(deployment: SimulatedDeployment) -> None:
    prompt, output = 512, 128
    trace = _fixed_trace([10.0 + 60.0 * i for i in range(20)], prompt, output, 1210.0)
    result = simulate(deployment, trace, StaticPolicy(1, 0.0, 0.0), FleetConfig(tail_s=60.0))
    m = result.metrics
    assert m["completed"] == 20 and m["dropped"] == 0 and m["unfinished"] == 0 and m["preemptions"] == 0
    truth = build_replica_model(deployment.server_setup)
    # The client sees the engine's prefill plus the API server's share (efficiency.request_overhead_s).
    prefill_ms = 1e3 * (float(truth.prefill_s(prompt)) + truth.setup.efficiency.ttft_overhead_s(truth.arch.num_layers))
    decode_ms = 1e3 * float(truth.decode_step_s(1, prompt + output / 2))
    for key in ("p50_ttft_ms", "p99_ttft_ms"):
        assert m[key] == pytest.approx(prefill_ms, rel=0.02)
    for key in ("p50_tpot_ms", "p99_tpot_ms"):
        assert m[key] == pytest.approx(decode_ms, rel=0.02)
    assert m["slo_attainment"] == 1.0 and result.met_slo.shape == (20,) and result.met_slo.all()
    assert m["gpu_hours"] == pytest.approx(deployment.tensor_parallel * m["simulated_s"] / 3600, rel=1e-3)
    # Over the trace's span alone: the tail simulated for requests in flight is not billed there.
    assert m["simulated_s"] > m["duration_s"]
    assert m["trace_gpu_hours"] == pytest.approx(deployment.tensor_parallel * m["duration_s"] / 3600, rel=1e-3)
    assert m["trace_mean_replicas"] == pytest.approx(1.0, rel=1e-3)


def test_overload_grows_the_queue_and_ttft_without_bound(deployment: SimulatedDeployment) -> None:
    # Far beyond one replica's capacity (a few requests/s for this shape): the queue only grows.
    trace = generate_synthetic_trace("synthetic:poisson:rate=20:duration=240:input=1024:output=256:seed=3")
    result = simulate(deployment, trace, StaticPolicy(1, 0.0, 0.0), FleetConfig(tail_s=0.0))
    waiting = [p.waiting for p in result.timeline]
    assert waiting[-1] > 1000 and all(b >= a for a, b in itertools.pairwise(waiting[4:]))
    sim = result.metrics
    assert sim["unfinished"] > 0.8 * sim["requests"]
    # TTFT of whoever got a first token grows with arrival time.
    ttft = [p.ttft_s for p in result.timeline if p.ttft_s is not None]
    assert ttft[-1] > 5 * ttft[1] and ttft[-1] > 60.0
    # Per request, in arrival order: the latest arrivals, deepest in the queue, all missed.
    assert result.met_slo.shape == (sim["requests"],)
    assert result.met_slo.mean() == pytest.approx(sim["slo_attainment"], abs=1e-5)
    assert not result.met_slo[-100:].any()


def test_step_cost_is_the_models_step_time() -> None:
    rng = np.random.default_rng(0)
    for model_name, gpu_name, tp in (("meta-llama/Llama-3.1-8B-Instruct", "L4", 2),
                                     ("Qwen/Qwen3-30B-A3B", "H100-SXM", 2),
                                     ("google/gemma-3-27b-it", "H100-SXM", 2)):
        arch = resolve_architecture(model_name)
        setup = ServingSetup(arch, find_gpu(gpu_name), tp, arch.native_precision)
        model = build_replica_model(setup)
        cost = StepCost(model, setup.token_budget + 256)
        for _ in range(200):
            d, p, ps = int(rng.integers(0, 256)), int(rng.integers(0, setup.token_budget)), int(rng.integers(0, 4))
            ctx, pairs = float(rng.uniform(1, 30_000)), float(rng.uniform(0, 1e8))
            expected = float(model.step_s(d, ctx, p, pairs, ps))
            assert cost.step_s(d, d * ctx, p, pairs, ps) == pytest.approx(expected, rel=1e-9)


def test_a_full_cache_preempts_and_recomputes_yet_everything_finishes(deployment: SimulatedDeployment) -> None:
    small = replace(deployment, server_kv_cache_tokens=12_000)
    trace = generate_synthetic_trace("synthetic:poisson:rate=0.3:duration=120:input=1500:output=600:seed=1")
    result = simulate(small, trace, StaticPolicy(1, 0.0, 0.0), FleetConfig(tail_s=600.0))
    m = result.metrics
    assert m["preemptions"] > 0
    assert m["completed"] == m["requests"] - m["dropped"] and m["unfinished"] == 0


def test_requests_longer_than_max_model_len_are_dropped(deployment: SimulatedDeployment) -> None:
    trace = _fixed_trace([1.0, 2.0], deployment.max_model_len, 10, 10.0)
    m = simulate(deployment, trace, StaticPolicy(1, 0.0, 0.0), FleetConfig(tail_s=30.0)).metrics
    assert m["dropped"] == 2 and m["slo_attainment"] == 0.0


def test_the_simulator_calls_the_operators_policy_function_itself() -> None:
    assert kvscale.sim.policies.decide is kvscale.autoscaler.decide
    assert vars(kvscale.sim.policies)["calibrate"] is kvscale.autoscaler.calibrate
    definitions = [path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                   if re.search(r"^def decide\(", path.read_text(), re.MULTILINE)]
    assert definitions == ["autoscaler/policy.py"]
    # Wherever the operator's controllers call the policy, it is this very function.
    for path in (PACKAGE / "controllers").glob("*.py"):
        module = importlib.import_module(f"kvscale.controllers.{path.stem}")
        if hasattr(module, "decide"):
            assert module.decide is kvscale.autoscaler.decide


def test_kvscale_policy_decides_and_calibrates_every_sync(deployment: SimulatedDeployment) -> None:
    trace = generate_synthetic_trace("synthetic:diurnal:rate=3:amplitude=0.9:period=600:duration=600:"
                                     "input=512:output=256:lengths=exponential")
    policy = build_policy("kvscale", deployment, trace)
    assert isinstance(policy, KvscalePolicy)
    result = simulate(deployment, trace, policy, FleetConfig(tail_s=60.0))
    detail = result.metrics["policy_detail"]
    assert sum(detail["decisions_by_action"].values()) == len(result.timeline)
    calibration = detail["calibration"]
    assert calibration["samples"] > 10
    # The servers decode 20% slower than the planner's defaults, plus a larger step overhead.
    assert calibration["decode_factor"] < 0.95
    assert result.metrics["max_replicas"] > policy.initial_replicas()  # the load rose nine-fold: it scaled up


def _fleet(now: float, current: int, ready: int | None = None) -> FleetState:
    ready = current if ready is None else ready
    return FleetState(now_s=now, current_replicas=current, ready_replicas=ready, starting_replicas=current - ready,
                      free_replica_slots=None)


def test_hpa_scales_up_at_most_max_4_or_100_percent_and_down_after_300_s() -> None:
    from kvscale.autoscaler import Observation
    from kvscale.sim.observe import WindowStats

    def stats(usage: float, now: float) -> WindowStats:
        obs = Observation(sampled_at_s=now, pods_scraped=2, request_rate=1.0, mean_input_tokens=100,
                          mean_output_tokens=100, running_requests=4, waiting_requests=0, kv_cache_usage=usage,
                          ttft_s=0.1, tpot_s=0.01)
        return WindowStats(observation=obs, mean_prefill_s=0.05)

    hpa = HpaPolicy("hpa-kv", lambda o: o.kv_cache_usage, 0.7, 2, 1, 100)
    assert hpa.desired_replicas(stats(0.74, 0), _fleet(0, 2)) == 2  # within the 10% tolerance
    assert hpa.desired_replicas(stats(1.4 * 10, 15), _fleet(15, 2)) == 6  # 2 + 4
    assert hpa.desired_replicas(stats(1.0, 30), _fleet(30, 10)) == 15  # ceil(10 x 1/0.7), within 100%
    assert hpa.desired_replicas(stats(0.07, 45), _fleet(45, 15)) == 15  # the down-window remembers 15
    for t in range(60, 345, 15):
        hpa.desired_replicas(stats(0.07, t), _fleet(t, 15))
    assert hpa.desired_replicas(stats(0.07, 360), _fleet(360, 15)) == 2  # ceil(15 x 0.1)


def test_static_peak_is_the_peak_over_a_load_tested_server(deployment: SimulatedDeployment) -> None:
    trace = generate_synthetic_trace("synthetic:bursts:rate=1:burst_rate=12:every=300:length=60:duration=600:"
                                     "input=1024:output=128:lengths=exponential")
    test = load_test_capacity(deployment, trace)
    slo = deployment.spec.slo
    assert test.rate_per_replica > 0 and test.ttft_ms is not None and test.ttft_ms <= slo.ttft_ms
    assert test.tpot_ms is not None and test.tpot_ms <= slo.tpot_ms
    # One server really holds the SLO percentile at the tested rate, and no longer well above it.
    held = [measure_at_rate(deployment, trace, test.rate_per_replica * f)[0] for f in (1.0, 1.5)]
    assert held == [True, False]
    policy = build_policy("static-peak", deployment, trace)
    assert isinstance(policy, StaticPolicy)
    assert policy.initial_replicas() == int(np.ceil(trace.peak_rate() / test.rate_per_replica - 1e-9))


def test_static_peak_load_tests_the_servers_of_the_run_in_their_form(deployment: SimulatedDeployment) -> None:
    # `vllm bench serve` measures the servers the fleet will run: where they differ from the model in form
    # (here attention that grows steeply with context, and jittery step overheads), the load test, and the
    # static fleet sized from it, see that form, not the model's.
    trace = generate_synthetic_trace("synthetic:bursts:rate=1:burst_rate=12:every=300:length=60:duration=600:"
                                     "input=1024:output=128:lengths=exponential")
    slow = ServerForm(attention_growth_tokens=512.0, overhead_jitter_cv=0.5)
    as_modelled = load_test_capacity(deployment, trace)
    in_form = load_test_capacity(deployment, trace, slow)
    assert in_form.rate_per_replica < 0.9 * as_modelled.rate_per_replica
    assert measure_at_rate(deployment, trace, in_form.rate_per_replica, slow)[0]
    assert not measure_at_rate(deployment, trace, as_modelled.rate_per_replica, slow)[0]
    # `kvscale simulate --policy static-peak` load-tests the run's own servers.
    result = run_simulation(deployment, trace, "static-peak", config=FleetConfig(server_form=slow))
    assert result.metrics["policy_detail"]["load_test"]["rate_per_replica"] == round(in_form.rate_per_replica, 4)


def test_static_peak_stays_within_the_resources_replica_bounds(deployment: SimulatedDeployment) -> None:
    # The peak minute needs several servers, but the resource allows at most 2: no policy runs more.
    trace = generate_synthetic_trace("synthetic:bursts:rate=1:burst_rate=12:every=300:length=60:duration=600:"
                                     "input=1024:output=128:lengths=exponential")
    unbounded = build_policy("static-peak", deployment, trace)
    assert isinstance(unbounded, StaticPolicy) and unbounded.replicas > 2
    scaling = deployment.spec.scaling.model_copy(update={"max_replicas": 2})
    small = replace(deployment, spec=deployment.spec.model_copy(update={"scaling": scaling}))
    bounded = build_policy("static-peak", small, trace)
    assert isinstance(bounded, StaticPolicy) and bounded.initial_replicas() == 2
    assert bounded.summary()["unbounded_replicas"] == unbounded.replicas


def test_traces_parse_from_csv_and_gzip_and_scale_in_time(tmp_path: Path) -> None:
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
            "2023-11-16 18:15:50.9951690,396,0\n2023-11-16 18:15:51.2224670,879,55\n")
    plain = parse_trace_csv(text.encode(), "t.csv")
    zipped = parse_trace_csv(gzip.compress(text.encode()), "t.csv.gz")
    for trace in (plain, zipped):
        assert trace.requests == 3
        assert trace.arrival_s.tolist() == pytest.approx([0.0, 4.314579, 4.541876])
        assert trace.output_tokens.tolist() == [44, 1, 55]
    fast = plain.sped_up(2)
    assert fast.arrival_s[-1] == pytest.approx(plain.arrival_s[-1] / 2) and fast.duration_s == plain.duration_s / 2
    assert plain.truncated(4.4).requests == 2
    rest = plain.after(4.4)  # the rest after a cut starts at 0 and keeps its requests' lengths
    assert rest.requests == 1 and rest.arrival_s.tolist() == pytest.approx([plain.arrival_s[-1] - 4.4])
    assert rest.input_tokens.tolist() == [879] and rest.duration_s == pytest.approx(plain.duration_s - 4.4)


@pytest.mark.parametrize(("name", "rows"), [("azure-conv", 19_366), ("azure-code", 8_819)])
def test_packaged_traces_load_with_their_attribution(name: str, rows: int) -> None:
    from kvscale.cli.simulate_cmd import load_trace

    trace = load_trace(name)
    assert trace.requests == rows and trace.attribution == AZURE_ATTRIBUTION
    assert 3400 < trace.duration_s < 3700 and "CC BY 4.0" in AZURE_ATTRIBUTION
    readme = (PACKAGE / "sim" / "data" / "README.md").read_text()
    assert "Creative Commons" in readme and "Splitwise" in readme


def test_synthetic_traces_are_deterministic_and_have_their_rates() -> None:
    a = generate_synthetic_trace("synthetic:poisson:rate=5:duration=2000:seed=7")
    b = generate_synthetic_trace("synthetic:poisson:rate=5:duration=2000:seed=7")
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert a.mean_rate == pytest.approx(5.0, rel=0.05)
    diurnal = generate_synthetic_trace("synthetic:diurnal:rate=5:amplitude=1:period=2000:duration=2000")
    rates = diurnal.rate_per_window(200)
    assert rates[0] < 1.5 and rates[4] > 8.0  # low at the start, high half a period in
    bursts = generate_synthetic_trace("synthetic:bursts:rate=1:burst_rate=20:every=500:length=100:duration=1000")
    assert bursts.peak_rate(100) > 15 and float(np.min(bursts.rate_per_window(100))) < 2.5


def test_a_synthetic_request_shape_drifts_linearly_or_daily() -> None:
    linear = generate_synthetic_trace("synthetic:poisson:rate=20:duration=1000:input=1000:input_to=5000:"
                                      "output=300:output_to=100:drift=linear:lengths=exponential:seed=3")
    first, last = linear.arrival_s < 200, linear.arrival_s >= 800
    assert float(np.mean(linear.input_tokens[first])) == pytest.approx(1400, rel=0.15)  # the mean at t = 100 s
    assert float(np.mean(linear.input_tokens[last])) == pytest.approx(4600, rel=0.15)
    assert float(np.mean(linear.output_tokens[last])) < float(np.mean(linear.output_tokens[first])) * 0.6
    daily = generate_synthetic_trace("synthetic:diurnal:rate=10:period=1000:duration=2000:input=500:input_to=4000:"
                                     "drift=daily")
    phase = np.mod(daily.arrival_s, 1000.0)
    assert int(daily.input_tokens[np.argmin(np.abs(phase - 500))]) == pytest.approx(4000, rel=0.01)  # the peak's
    assert int(daily.input_tokens[np.argmin(phase)]) == pytest.approx(500, rel=0.01)
    assert np.all(daily.output_tokens == 256)  # no output_to: no drift there
    for bad in ("input_to=900", "drift=linear", "drift=sideways:input_to=900"):
        with pytest.raises(InvalidSpecError, match="drift"):
            generate_synthetic_trace(f"synthetic:poisson:rate=1:duration=10:{bad}")


def test_cli_policy_names_match_the_simulator() -> None:
    from kvscale.cli.simulate_cmd import POLICY_NAMES, TRACE_NAMES
    from kvscale.sim import PACKAGED_TRACES, POLICIES

    assert POLICY_NAMES == POLICIES and tuple(PACKAGED_TRACES) == TRACE_NAMES


class _Recording:
    """A fixed fleet that keeps every window the scraper showed it."""

    name = "recording"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.seen: list[WindowStats] = []

    def initial_replicas(self) -> int:
        return self.replicas

    def desired_replicas(self, stats: WindowStats, fleet: FleetState) -> int:
        self.seen.append(stats)
        return self.replicas

    def summary(self) -> dict[str, object]:
        return {}


def test_the_scrape_shows_seconds_long_bursts_and_the_prefill_percentile(deployment: SimulatedDeployment) -> None:
    steady = [0.5 + i for i in range(120)]
    burst = [60.0 + 3.0 * i / 90 for i in range(90)]  # 90 more requests within 3 s
    trace = replace(_fixed_trace(sorted(steady + burst), 128, 16, 120.0),
                    input_tokens=np.array([128 if i % 10 else 1024 for i in range(210)], dtype=np.int64))
    recording = _Recording(2)
    simulate(deployment, trace, recording, FleetConfig(tail_s=90.0))
    at_75 = next(s for s in recording.seen if s.observation.sampled_at_s == 75.0).observation
    assert at_75.request_rate is not None and at_75.peak_request_rate is not None
    assert at_75.request_rate == pytest.approx((60 + 90) / 60, rel=0.1)
    # The busiest 30 s of the window: the burst and the steady requests around it.
    assert at_75.peak_request_rate == pytest.approx((30 + 90) / 30, rel=0.1)
    assert at_75.peak_request_rate > 1.5 * at_75.request_rate  # the window's mean flattens the burst
    quiet = recording.seen[-1].observation  # after the trace: nothing finishes, nothing peaks
    assert quiet.peak_request_rate == 0.0
    # Short prompts prefill inside vLLM's first prefill bucket (0.3 s): the scrape says the percentile is
    # below resolution instead of reporting 0.95 x 0.3 s, and the prompt-length percentile is read instead.
    finished = [s.observation for s in recording.seen if s.mean_prefill_s is not None]
    assert finished and all(o.prefill_quantile_s is None for o in finished)
    assert all(o.bound_of("prefill_quantile_s") == REQUEST_LATENCY_BUCKETS_S[0] for o in finished)
    # the 1024-token prompts, in the bucket (1000, 2000]: 1-2-5 buckets are coarse, but they are resolved
    assert at_75.input_tokens_quantile is not None and 1000 < at_75.input_tokens_quantile <= 2000
    # The TTFT and TPOT histograms, as rates over the window: their +Inf buckets count the window's requests
    # (those whose first token, and those that finished, fell in it), and the share within an SLO reads them.
    assert at_75.ttft_buckets[-1][0] == math.inf and at_75.tpot_buckets[-1][0] == math.inf
    assert at_75.ttft_buckets[-1][1] == pytest.approx(at_75.request_rate, rel=0.1)
    assert at_75.missed_slo_share(3600.0, 3600.0) == 0.0
    assert at_75.missed_slo_share(1e-9, 1e-9) == 1.0


@pytest.mark.parametrize(("values", "quantile", "expected"), [
    ([0.1, 0.2, 0.4, 0.6], 0.5, 0.3),  # rank 2 of 4: the end of the first bucket (0.3)
    ([0.1, 0.2, 0.4, 0.6], 0.75, 0.5),  # rank 3: the end of (0.3, 0.5]
    ([0.1, 0.2, 0.4, 0.6], 0.625, 0.4),  # rank 2.5: halfway into (0.3, 0.5]
    ([9000.0], 0.99, 7680.0),  # in +Inf: the highest finite bound, as Prometheus answers
])
def test_histogram_quantile_interpolates_like_prometheus(values: list[float], quantile: float,
                                                         expected: float) -> None:
    result = histogram_percentile(quantile, np.array(values), REQUEST_LATENCY_BUCKETS_S)
    assert result is not None and result.value == pytest.approx(expected)
    assert histogram_percentile(quantile, np.array([]), REQUEST_LATENCY_BUCKETS_S) is None


def test_the_weekly_trace_has_quiet_nights_busy_afternoons_and_a_lighter_weekend() -> None:
    trace = generate_synthetic_trace("synthetic:weekly:rate=2:duration=259200:start_day=6:weekend=0.5:seed=0")
    hourly = np.bincount((trace.arrival_s // 3600).astype(np.int64), minlength=72) / 3600.0
    sunday, monday, tuesday = hourly[:24], hourly[24:48], hourly[48:]
    assert monday.mean() == pytest.approx(2.0, rel=0.03) and tuesday.mean() == pytest.approx(2.0, rel=0.03)
    assert sunday.mean() == pytest.approx(1.0, rel=0.05)  # the weekend at half a weekday
    assert int(np.argmax(monday)) in (15, 16, 17) and int(np.argmin(monday)) in (3, 4, 5)
    assert monday.max() > 5 * monday.min()


def test_measured_like_servers_differ_from_the_model_in_form_not_only_in_scale() -> None:
    arch = resolve_architecture("meta-llama/Llama-3.1-8B-Instruct")
    setup = ServingSetup(arch, find_gpu("L4"), 2, arch.native_precision)
    model = build_replica_model(setup)
    plain = StepCost(model, setup.token_budget + 256)
    form = ServerForm(attention_growth_tokens=16_384.0, overhead_jitter_cv=0.5, seed=3)
    grown = StepCost(model, setup.token_budget + 256, form)
    # decode attention per token grows with the mean context: no extra at a short context, +25% at 4k...
    for mean_context in (16.0, 4096.0, 16_384.0):
        extra = grown.step_s(32, 32 * mean_context) - plain.step_s(32, 32 * mean_context)
        attention = plain.step_s(32, 32 * mean_context) - plain.step_s(32, 0.0)
        assert extra == pytest.approx(attention * mean_context / 16_384.0, rel=1e-9)
    # ...so no scale factor of the model's makes up for it: the step's growth with context is not linear
    growth = [grown.step_s(32, 32 * c) - grown.step_s(32, 0.0) for c in (2048.0, 4096.0, 8192.0)]
    assert growth[2] - growth[1] > 2.1 * (growth[1] - growth[0])
    # step overheads jitter around their mean: the sum over k steps has the mean 0 and the spread sqrt(k) cv
    overhead = setup.efficiency.step_overhead_s
    single = np.array([grown.overhead_noise_s(1) for _ in range(20_000)])
    assert abs(single.mean()) < 0.02 * overhead and single.std() == pytest.approx(0.5 * overhead, rel=0.05)
    hundred = np.array([grown.overhead_noise_s(100) for _ in range(5_000)])
    assert hundred.std() == pytest.approx(10 * 0.5 * overhead, rel=0.06)
    assert plain.overhead_noise_s(100) == 0.0


def test_the_jitter_lengthens_the_tpot_tail_and_is_seeded(deployment: SimulatedDeployment) -> None:
    trace = generate_synthetic_trace("synthetic:poisson:rate=1:duration=300:input=512:output=128:seed=2")
    jittery = FleetConfig(server_form=ServerForm(overhead_jitter_cv=1.0, seed=5))
    plain = simulate(deployment, trace, StaticPolicy(1, 0.0, 0.0), FleetConfig()).metrics
    first = simulate(deployment, trace, StaticPolicy(1, 0.0, 0.0), jittery).metrics
    again = simulate(deployment, trace, StaticPolicy(1, 0.0, 0.0), jittery).metrics
    assert first == again  # the same seed, the same run
    assert first["p99_tpot_ms"] > plain["p99_tpot_ms"]
    assert first["p50_tpot_ms"] == pytest.approx(plain["p50_tpot_ms"], rel=0.1)  # the mean is kept
    assert plain["server_form"] == "as modelled" and "CV 1" in first["server_form"]


def test_cli_server_forms_match_the_simulator() -> None:
    from kvscale.cli.simulate_cmd import SERVER_FORM_NAMES

    assert tuple(SERVER_FORMS) == SERVER_FORM_NAMES and SERVER_FORMS["measured-like"] == MEASURED_LIKE_FORM

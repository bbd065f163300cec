"""kvscale's Prometheus edge against the bed's real Prometheus scraping real vLLM simulators."""

from __future__ import annotations

import itertools
import time

from bedkit import Prometheus, SimFactory, wait_until

from kvscale.autoscaler import check_observation
from kvscale.metrics import DeploymentKey, PrometheusSource

WINDOW_S = 180


def test_one_pass_yields_an_observation_per_deployment(prometheus: Prometheus, inference_sim: SimFactory) -> None:
    # Two replicas of one deployment, one replica of another, in the same namespace.
    chat = [inference_sim(model="chat-model", max_num_seqs=4, ttft_ms=40, itl_ms=5) for _ in range(2)]
    code = inference_sim(model="code-model", max_num_seqs=4, ttft_ms=40, itl_ms=5)
    for i, sim in enumerate(chat):
        prometheus.add_target(f"metrics-chat-{i}", sim.host_port,
                              {"namespace": "metrics-test", "llmdeployment": "chat", "pod": f"chat-{i}"})
    prometheus.add_target("metrics-code-0", code.host_port,
                          {"namespace": "metrics-test", "llmdeployment": "code", "pod": "code-0"})
    for sim in (*chat, code):
        prometheus.wait_for_target_up(sim.host_port, timeout=30)
        # The simulator creates its counter series on the first request (vLLM pre-creates them):
        # one warm-up request, scraped, so that rate() sees the increase of the requests below. Every
        # request ignores EOS, so all finish by "length": request_success_total has a series per finish
        # reason, and with random lengths the requests could finish by "stop", a series first scraped
        # after them, which shows no increase (CI failed on it: a request rate of 0 for 90 s).
        sim.completion(max_tokens=4, ignore_eos=True)
    prometheus.wait_for_query('count(vllm:request_success_total{namespace="metrics-test"})',
                              lambda rows: bool(rows) and float(rows[0]["value"][1]) >= 3, timeout=30)
    for _ in range(6):
        for sim in chat:
            sim.completion(max_tokens=12, ignore_eos=True)
    code.completion(max_tokens=12, ignore_eos=True)
    # Every request has returned; wait for a scrape of every replica after that, or an earlier
    # scrape taken mid-request would still read as a running request.
    idle_since_s = time.time()
    prometheus.wait_for_query(
        'min(timestamp(vllm:num_requests_running{namespace="metrics-test"}))',
        lambda rows: bool(rows) and float(rows[0]["value"][1]) > idle_since_s, timeout=30)

    # A window far longer than the requests above take, so none of them sits on its edge, and longer than
    # the wait below plus a fetch (a dozen queries), so the requests are still inside it when it settles.
    source = PrometheusSource(prometheus.url, window_s=WINDOW_S)
    keys = [DeploymentKey("metrics-test", "chat"), DeploymentKey("metrics-test", "code"),
            DeploymentKey("metrics-test", "absent")]

    last_seen: list[object] = [None]

    def settled() -> object:
        result = source.fetch(keys, 0.95)
        chat_obs = last_seen[0] = result.observations.get(keys[0])
        # The peak is a subquery evaluated at step-aligned instants: until one of them falls after the scrape
        # that saw the requests it reads 0, not None (the warm-up created the series), so wait for it to rise.
        ready = (chat_obs is not None and (chat_obs.request_rate or 0) > 0 and chat_obs.tpot_mean_s is not None
                 and (chat_obs.peak_request_rate or 0) > 0)
        return result if ready else None

    try:
        result = wait_until(settled, 90, "request rate, TPOT and peak request rate for the chat deployment")
    except AssertionError as exc:  # say what was read: this wait has timed out in CI runs before
        raise AssertionError(f"{exc}; the last chat observation: {last_seen[0]}") from None
    chat_obs, code_obs = result.observations[keys[0]], result.observations[keys[1]]
    seen = f"chat: {chat_obs}; code: {code_obs}"  # every assertion below says what it saw
    assert keys[2] not in result.observations
    assert chat_obs.window_s == WINDOW_S  # the policy weighs rate noise by it
    assert chat_obs.pods_scraped == 2 and code_obs.pods_scraped == 1, seen
    assert chat_obs.mean_output_tokens is not None and 1 <= chat_obs.mean_output_tokens <= 12, seen
    assert chat_obs.request_rate is not None and code_obs.request_rate is not None, seen
    assert chat_obs.request_rate > code_obs.request_rate, seen
    # averaged over the last 30 s (one scrape reads 0 between two engine steps): at most the one request
    # each replica ran at a time, and 0 waiting (a single scrape after the requests returned)
    assert chat_obs.running_requests is not None and 0 <= chat_obs.running_requests <= 2, seen
    assert chat_obs.waiting_requests == 0, seen
    # the window's mean batch (avg_over_time): one request at a time on each of the two replicas, at most
    assert chat_obs.mean_running_requests is not None and 0 <= chat_obs.mean_running_requests <= 2, seen
    # The busiest 30 s of the window (a subquery). The sims prefill in ~40 ms and decode a token every
    # 5 ms: inside vLLM's first prefill bucket (0.3 s) and first TPOT bucket (10 ms), so both percentiles
    # are reported as bounds, not as the 0.285 s and 9.5 ms histogram_quantile would interpolate.
    assert chat_obs.peak_request_rate is not None and chat_obs.peak_request_rate > 0, seen
    assert chat_obs.prefill_quantile_s is None and chat_obs.bound_of("prefill_quantile_s") == 0.3, seen
    assert chat_obs.tpot_s is None and chat_obs.bound_of("tpot_s") == 0.01, seen
    assert chat_obs.tpot_mean_s is not None and 0 < chat_obs.tpot_mean_s < 0.01, seen
    assert chat_obs.ttft_s is not None and chat_obs.input_tokens_quantile is not None, seen
    assert chat_obs.aborted_rate in (None, 0) and chat_obs.failed_rate in (None, 0), seen
    # The TTFT and TPOT histograms themselves, for the share of requests within an SLO: ordered bucket rates
    # ending in +Inf, which counts every request of the window. Every request's first token took ~40 ms and
    # every token 5 ms: all within SLOs of 1 s, none within a TTFT SLO of 1 ms (vLLM's first bucket).
    for buckets in (chat_obs.ttft_buckets, chat_obs.tpot_buckets):
        assert buckets and buckets[-1][0] == float("inf") and buckets[-1][1] > 0, seen
        assert [b for b, _ in buckets] == sorted(b for b, _ in buckets), seen
    assert chat_obs.missed_slo_share(1.0, 1.0) == 0.0, seen
    assert chat_obs.missed_slo_share(0.001, 1.0) == 1.0, seen
    assert check_observation(chat_obs, time.time(), 120) is None, seen
    assert check_observation(result.observations.get(keys[2]), time.time(), 120) is not None

    # The history a restarted operator seeds its forecasts with: a range query, one point per step.
    # (the series are seconds old here: wait for a few points of them)
    def some_history() -> object:
        found = source.arrivals_history(keys, lookback_s=WINDOW_S, step_s=2.0, rate_window_s=30.0)
        return found if len(found.get(keys[0], [])) >= 3 else None

    history = wait_until(some_history, 30, "three points of the chat deployment's arrivals history")
    assert keys[2] not in history and set(history) == set(keys[:2]), history
    chat_points = history[keys[0]]
    assert len(chat_points) >= 3 and all(b[0] - a[0] >= 2.0 for a, b in itertools.pairwise(chat_points))
    assert max(rate for _, rate in chat_points) > 0, chat_points
    assert max(rate for _, rate in chat_points) > max(rate for _, rate in history[keys[1]]), history

    # Requests in flight per pod (what a scale-down spares): every replica, none busier than one at a time.
    loads = source.in_flight_by_pod(keys)
    assert set(loads) == set(keys[:2]) and set(loads[keys[0]]) == {"chat-0", "chat-1"}, loads
    assert all(0 <= load <= 1 for pods in loads.values() for load in pods.values()), loads

    # A replica that goes away stops counting once Prometheus marks its series stale.
    prometheus.remove_target("metrics-chat-1")
    wait_until(lambda: source.fetch(keys[:1], 0.95).observations[keys[0]].pods_scraped == 1, 60,
               "the removed replica's series to go stale")


def test_an_unreachable_prometheus_is_an_owned_error() -> None:
    import pytest

    from kvscale.metrics import MetricsUnavailableError

    with pytest.raises(MetricsUnavailableError, match="failed"):
        PrometheusSource("http://127.0.0.1:9", window_s=30).fetch([DeploymentKey("a", "b")], 0.95)

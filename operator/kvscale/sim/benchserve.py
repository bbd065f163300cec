"""`vllm bench serve` against one simulated server: an open loop (Poisson arrivals at a rate) or a
closed loop (a fixed number of clients, each sending its next request when the last one finished).

Requests are drawn from a trace's lengths (with replacement, seeded). The result holds every
request's TTFT and TPOT, so callers read whichever statistic they compare: the mean for published
benchmarks, the SLO percentile for the planner's promise.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvscale.perfmodel import build_replica_model
from kvscale.sim.deployment import SimulatedDeployment
from kvscale.sim.server import Replica, RequestLog, StepCost
from kvscale.sim.trace import Trace

Array = NDArray[np.float64]
_ONE_STEP_S = 1e-9  # advancing the clock by less than a step runs exactly one step
CLIENT_TURNAROUND_S = 1e-3  # streaming the last token to the client and its next request back


@dataclass(frozen=True)
class BenchRun:
    """Per-request outcomes of one benchmark run (seconds), warm-up requests excluded."""

    ttft_s: Array
    tpot_s: Array  # requests of 2+ output tokens only, as vLLM's histogram counts them
    duration_s: float
    output_tokens: int
    prefix_cache_hit_rate: float  # prompt tokens found in the prefix cache over those looked up

    def ttft_percentile_s(self, percentile: float) -> float:
        return float(np.percentile(self.ttft_s, percentile))

    def tpot_percentile_s(self, percentile: float) -> float:
        return float(np.percentile(self.tpot_s, percentile))

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0


def _log(deployment: SimulatedDeployment, trace: Trace, arrivals: NDArray[np.float64], rng: np.random.Generator,
         ) -> RequestLog:
    """`arrivals.size` requests drawn from those of the trace the server accepts (within max-model-len
    and the cache), with their shared prefixes if the trace has them."""
    limit = min(deployment.max_model_len, deployment.server_kv_cache_tokens)
    fits = np.flatnonzero(trace.input_tokens + trace.output_tokens <= limit)
    picks = fits[rng.integers(0, fits.size, arrivals.size)]
    return RequestLog(arrivals, trace.input_tokens[picks], trace.output_tokens[picks],
                      None if trace.prefix_group is None else trace.prefix_group[picks],
                      None if trace.prefix_tokens is None else trace.prefix_tokens[picks])


def _replica(deployment: SimulatedDeployment, log: RequestLog) -> Replica:
    setup = deployment.server_setup
    cost = StepCost(build_replica_model(setup), setup.token_budget + deployment.max_num_seqs)
    return Replica(0, cost, log, token_budget=setup.token_budget, max_num_seqs=deployment.max_num_seqs,
                   kv_cache_tokens=deployment.server_kv_cache_tokens, started_s=0.0, ready_s=0.0)


def _result(log: RequestLog, warmup: int) -> BenchRun:
    keep = np.zeros(log.arrival_s.size, dtype=bool)
    keep[warmup:] = True
    done = keep & ~np.isnan(log.finish_s)
    ttft = (log.first_token_s - log.arrival_s)[done]
    many = done & (log.output_tokens > 1)
    tpot = ((log.finish_s - log.first_token_s) / np.maximum(log.output_tokens - 1, 1))[many]
    start = float(np.min(log.arrival_s[done])) if done.any() else 0.0
    end = float(np.max(log.finish_s[done])) if done.any() else 0.0
    hit_rate = log.prefix_cache_hits / log.prefix_cache_queries if log.prefix_cache_queries else 0.0
    return BenchRun(ttft_s=ttft, tpot_s=tpot, duration_s=end - start, output_tokens=int(log.output_tokens[done].sum()),
                    prefix_cache_hit_rate=hit_rate)


def replay_open_loop(deployment: SimulatedDeployment, trace: Trace, rate: float, count: int,
                     seed: int = 0) -> RequestLog:
    """`count` Poisson arrivals at `rate` requests/s on one replica until it is idle, every request's times
    kept (run_open_loop's run; the experiments in docs/experiments look inside it)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, count)
    log = _log(deployment, trace, np.cumsum(gaps), rng)
    arrivals, inputs, outputs = log.arrival_s, log.input_tokens, log.output_tokens
    replica = _replica(deployment, log)
    for req, at in enumerate(arrivals.tolist()):
        replica.advance(at)
        replica.submit(req, int(inputs[req]), int(outputs[req]))
    while not replica.idle:
        replica.advance(replica.clock + 1.0)
    return log


def run_open_loop(deployment: SimulatedDeployment, trace: Trace, rate: float, count: int, seed: int = 0,
                  warmup: int = 0) -> BenchRun:
    """Poisson arrivals at `rate` requests/s (`vllm bench serve --request-rate`)."""
    return _result(replay_open_loop(deployment, trace, rate, count, seed), warmup)


def run_closed_loop(deployment: SimulatedDeployment, trace: Trace, concurrency: int, count: int, seed: int = 0,
                    warmup: int | None = None, turnaround_s: float = CLIENT_TURNAROUND_S) -> BenchRun:
    """`concurrency` clients, each sending its next request `turnaround_s` after its last one ends
    (`vllm bench serve --max-concurrency`): the engine has started its next step by then, and the
    request waits for it, as it does on a real server. The first `concurrency` requests (all sent at
    once) are warm-up by default, which leaves the steady state; `vllm bench serve` counts them in its
    means (`warmup=0` reproduces that; kvscale.perfmodel.serving.first_wave_ttft_mean_s models them)."""
    rng = np.random.default_rng(seed)
    log = _log(deployment, trace, np.full(count, np.nan), rng)
    arrivals, inputs, outputs = log.arrival_s, log.input_tokens, log.output_tokens
    replica = _replica(deployment, log)
    sent = min(concurrency, count)
    for req in range(sent):
        arrivals[req] = 0.0
        replica.submit(req, int(inputs[req]), int(outputs[req]))
    upcoming: deque[int] = deque()  # sent by a client, not yet at the server
    seen = 0
    while upcoming or not replica.idle:
        while upcoming and arrivals[upcoming[0]] <= replica.clock:
            req = upcoming.popleft()
            replica.submit(req, int(inputs[req]), int(outputs[req]))
        if replica.idle:
            replica.advance(float(arrivals[upcoming[0]]))  # nothing runs until the next request lands
            continue
        replica.advance(replica.clock + _ONE_STEP_S)
        finished = log.finish_order
        while seen < len(finished):
            done = finished[seen]
            seen += 1
            if sent < count:
                arrivals[sent] = log.finish_s[done] + turnaround_s
                upcoming.append(sent)
                sent += 1
    return _result(log, concurrency if warmup is None else warmup)

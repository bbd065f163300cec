"""The fleet: replicas that start, serve and drain, a router, and a scaler called every sync.

Discrete events in simulated seconds: arrivals (each routed to the ready replica with the fewest
requests in flight), scrapes (an Observation over the last window), scaling decisions, replicas
becoming ready after their start-up delay, and draining replicas leaving when empty. Between
events each replica runs its own engine steps (server.py). Nothing reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from kvscale.perfmodel import build_replica_model
from kvscale.sim.deployment import SimulatedDeployment
from kvscale.sim.observe import FleetScraper
from kvscale.sim.policies import FleetState, ScalingPolicy
from kvscale.sim.result import SimulationResult, TimelinePoint, summarize
from kvscale.sim.server import MODEL_FORM, Replica, RequestLog, ServerForm, StepCost
from kvscale.sim.trace import Trace


@dataclass(frozen=True)
class FleetConfig:
    """How the simulated cluster and its scaler behave."""

    startup_s: float = 120.0  # from scale-up to Ready: pod start, image, model load, warm-up
    # Where given, each new replica's start-up is drawn uniformly from this range instead (seeded);
    # the policy is not told: it measures the start-ups as the operator does.
    startup_range_s: tuple[float, float] | None = None
    seed: int = 0
    scrape_interval_s: float = 15.0
    window_s: float = 60.0  # rate() and histogram_quantile() window
    decision_interval_s: float = 15.0
    tail_s: float = 300.0  # simulated after the last arrival, for requests in flight to finish
    cluster_gpus: int | None = None  # GPUs of the plan's type in the cluster; None: unlimited
    server_form: ServerForm = MODEL_FORM  # how the servers' steps differ from the model in form


class _Fleet:
    def __init__(self, deployment: SimulatedDeployment, log: RequestLog, config: FleetConfig) -> None:
        self.deployment = deployment
        self.log = log
        self.config = config
        setup = deployment.server_setup
        self.cost = StepCost(build_replica_model(setup), setup.token_budget + deployment.max_num_seqs,
                             config.server_form)
        self.starting: list[Replica] = []
        self.ready: list[Replica] = []
        self.draining: list[Replica] = []
        self.stopped: list[Replica] = []
        self.pending: deque[int] = deque()  # arrivals while no replica is ready (held at the gateway)
        self.created = 0
        self.request_limit = min(deployment.max_model_len, deployment.server_kv_cache_tokens)
        self.rng = np.random.default_rng(config.seed)
        self.startups_s: list[float] = []  # measured (scale-up to Ready) of the replicas that came up

    def _startup_s(self) -> float:
        span = self.config.startup_range_s
        return self.config.startup_s if span is None else float(self.rng.uniform(span[0], span[1]))

    @property
    def replica_slots(self) -> int | None:
        gpus = self.config.cluster_gpus
        return None if gpus is None else gpus // self.deployment.gpus_per_replica

    @property
    def alive(self) -> int:
        return len(self.starting) + len(self.ready) + len(self.draining)

    def _new_replica(self, now_s: float, ready_s: float) -> Replica:
        d = self.deployment
        replica = Replica(self.created, self.cost, self.log, token_budget=d.server_setup.token_budget,
                          max_num_seqs=d.max_num_seqs, kv_cache_tokens=d.server_kv_cache_tokens, started_s=now_s,
                          ready_s=ready_s)
        self.created += 1
        return replica

    def start(self, replicas: int) -> None:
        self.ready = [self._new_replica(0.0, 0.0) for _ in range(replicas)]

    def activate(self, now_s: float) -> None:
        if self.starting and self.starting[0].ready_s <= now_s:
            became = [r for r in self.starting if r.ready_s <= now_s]
            self.starting = [r for r in self.starting if r.ready_s > now_s]
            self.startups_s.extend(r.ready_s - r.started_s for r in became)
            self.ready.extend(became)
            while self.pending and self.ready:
                self.route(self.pending.popleft())

    def advance(self, now_s: float) -> None:
        for replica in self.ready:
            replica.advance(now_s)
        if self.draining:
            for replica in self.draining:
                replica.advance(now_s)
            gone = [r for r in self.draining if r.idle]
            for replica in gone:
                replica.stopped_s = now_s
                self.stopped.append(replica)
            self.draining = [r for r in self.draining if not r.idle]

    def route(self, req: int) -> None:
        log = self.log
        prompt = int(log.input_tokens[req])
        out = int(log.output_tokens[req])
        if prompt + out > self.request_limit:
            log.dropped[req] = True  # the engine rejects a request longer than max-model-len
            return
        if not self.ready:
            self.pending.append(req)
            return
        target = min(self.ready, key=_outstanding)
        target.submit(req, prompt, out)

    def scale_to(self, desired: int, now_s: float) -> None:
        current = len(self.starting) + len(self.ready)
        if desired > current:
            add = desired - current
            slots = self.replica_slots
            if slots is not None:
                add = max(0, min(add, slots - self.alive))  # the rest would stay Pending
            self.starting.extend(self._new_replica(now_s, now_s + self._startup_s()) for _ in range(add))
            return
        remove = current - desired
        while remove and self.starting:
            replica = self.starting.pop()  # the newest pending pod goes first
            replica.stopped_s = now_s
            self.stopped.append(replica)
            remove -= 1
        if remove:
            order = sorted(self.ready, key=_outstanding)[:remove]
            self.ready = [r for r in self.ready if r not in order]
            for replica in order:
                replica.draining = True
                if replica.idle:
                    replica.stopped_s = now_s
                    self.stopped.append(replica)
                else:
                    self.draining.append(replica)

    def state(self, now_s: float) -> FleetState:
        slots = self.replica_slots
        return FleetState(now_s=now_s, current_replicas=len(self.starting) + len(self.ready),
                          ready_replicas=len(self.ready), starting_replicas=len(self.starting),
                          free_replica_slots=None if slots is None else max(0, slots - self.alive),
                          startups_s=tuple(self.startups_s), decision_interval_s=self.config.decision_interval_s)

    def all_replicas(self) -> list[Replica]:
        return [*self.stopped, *self.draining, *self.ready, *self.starting]


def _outstanding(replica: Replica) -> int:
    return replica.outstanding


def simulate(deployment: SimulatedDeployment, trace: Trace, policy: ScalingPolicy,
             config: FleetConfig | None = None) -> SimulationResult:
    """Replay `trace` against a fleet scaled by `policy`; every figure in simulated time."""
    config = config or FleetConfig()
    log = RequestLog(trace.arrival_s, trace.input_tokens, trace.output_tokens, trace.prefix_group, trace.prefix_tokens)
    fleet = _Fleet(deployment, log, config)
    fleet.start(policy.initial_replicas())
    scraper = FleetScraper(log, config.window_s, config.scrape_interval_s, deployment.spec.slo.percentile)
    interval = config.scrape_interval_s
    decide_every = max(1, round(config.decision_interval_s / interval))
    ticks = math.ceil((trace.duration_s + config.tail_s) / interval - 1e-9)
    arrivals = trace.arrival_s.tolist()
    timeline: list[TimelinePoint] = []
    i = 0
    n = len(arrivals)
    for tick in range(1, ticks + 1):
        now = tick * interval
        first = i
        while i < n and arrivals[i] < now:
            t = arrivals[i]
            fleet.activate(t)
            fleet.advance(t)
            fleet.route(i)
            i += 1
        fleet.activate(now)
        fleet.advance(now)
        stats = scraper.scrape(now, [*fleet.ready, *fleet.draining])
        desired = len(fleet.starting) + len(fleet.ready)
        if tick % decide_every == 0:
            desired = policy.desired_replicas(stats, fleet.state(now))
            fleet.scale_to(desired, now)
        obs = stats.observation
        timeline.append(TimelinePoint(
            t_s=now, arrival_rate=(i - first) / interval, finished_rate=obs.request_rate or 0.0,
            running=obs.running_requests or 0.0, waiting=(obs.waiting_requests or 0.0) + len(fleet.pending),
            desired_replicas=len(fleet.starting) + len(fleet.ready), ready_replicas=len(fleet.ready),
            paid_replicas=fleet.alive, ttft_s=obs.ttft_s, tpot_s=obs.tpot_s, kv_cache_usage=obs.kv_cache_usage))
    end = ticks * interval
    for replica in [*fleet.ready, *fleet.draining, *fleet.starting]:
        replica.stopped_s = end
    held = [(r.started_s, r.stopped_s if r.stopped_s is not None else end) for r in fleet.all_replicas()]
    gpu_s = deployment.gpus_per_replica * float(sum(stop - start for start, stop in held))
    # Paid while the trace ran: the tail after its last arrival is simulated only for requests in flight to
    # finish, and a schedule stitched over the trace's blocks is paid over the trace alone.
    span_s = trace.duration_s
    trace_gpu_s = deployment.gpus_per_replica * float(sum(max(0.0, min(stop, span_s) - min(start, span_s))
                                                          for start, stop in held))
    busy_s = float(sum(r.busy_s for r in fleet.all_replicas()))
    return summarize(deployment, trace, policy, log, timeline, gpu_s=gpu_s, trace_gpu_s=trace_gpu_s,
                     busy_replica_s=busy_s, simulated_s=end, replicas_created=fleet.created,
                     server_form="" if config.server_form == MODEL_FORM else config.server_form.describe)


__all__ = ["FleetConfig", "simulate"]

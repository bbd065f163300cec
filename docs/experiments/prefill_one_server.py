"""Calibration's expectation of vLLM's prefill time against one simulated server that runs the planner's own model.

Run from the repository root:
    .venv/bin/python docs/experiments/prefill_one_server.py [RATE ...]    # default 1 2 (requests/s)

One replica of examples/llama-3.1-8b-l4.yaml, its servers at the planner's efficiency and in the model's form (so
the true speed factors are 1), takes 15 minutes of Poisson arrivals with exponential prompt and output lengths
(means 1155 and 211 tokens, the conversation trace's). For every window with no request waiting for a slot, it
compares `estimate_at_observed_load(...).prefill_s` (at the window's mean batch, rate and mean lengths, the true
model) with the window's observed mean prefill time (a prompt's first scheduled step to its first token, as vLLM's
request_prefill_time_seconds), and prints the median ratio: for a shape known by its means only, and for the same
means with the exponential lengths' tail (`RequestShape.with_assumed_tail` at p95; calibration's shapes carry a
tail). Calibration moves the prefill factor until that ratio is 1; below 1 it learns a prefill slower than the
servers'. The thirty-second session's expectation (docs/experiments/2026-12-01-prefill-shared-steps-and-mix.diff)
landed in the thirty-third; run it at 56ec658 for the one before, or apply
docs/experiments/2026-11-30-prefill-shared-step.diff there for the thirty-first session's.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from kvscale.api.spec import load_resource
from kvscale.perfmodel import RequestShape, build_replica_model, estimate_at_observed_load
from kvscale.planner import build_plan_inputs
from kvscale.sim import FleetConfig, SimulatedDeployment, Trace, build_simulated_deployment, simulate
from kvscale.sim.observe import WindowStats
from kvscale.sim.policies import FleetState, StaticPolicy

EXAMPLE = Path("examples/llama-3.1-8b-l4.yaml")


class Recording(StaticPolicy):
    """One replica throughout; every window's figures kept."""

    def __init__(self) -> None:
        super().__init__(1)
        self.windows: list[WindowStats] = []

    def desired_replicas(self, stats: WindowStats, fleet: FleetState) -> int:
        self.windows.append(stats)
        return 1


def exact_deployment() -> SimulatedDeployment:
    """One replica of the example whose servers are the planner's model (its efficiency and form)."""
    deployment = build_simulated_deployment(build_plan_inputs(load_resource(EXAMPLE).spec))
    return replace(deployment, server_setup=replace(deployment.server_setup, efficiency=deployment.setup.efficiency))


def poisson_trace(rate_per_s: float) -> Trace:
    """15 minutes of Poisson arrivals with exponential lengths of the conversation trace's means."""
    rng = np.random.default_rng(7)
    count = int(rate_per_s * 900)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, count))
    inputs = np.maximum(rng.exponential(1155.0, count), 1.0).astype(np.int64)
    outputs = np.maximum(rng.exponential(211.0, count), 2.0).astype(np.int64)
    return Trace(name="poisson", arrival_s=arrivals, input_tokens=inputs, output_tokens=outputs,
                 duration_s=float(np.ceil(arrivals[-1])))


def median_ratios(rate_per_s: float) -> tuple[float, float, int]:
    deployment = exact_deployment()
    trace = poisson_trace(rate_per_s)
    policy = Recording()
    simulate(deployment, trace, policy, FleetConfig(tail_s=60.0))
    model = build_replica_model(deployment.setup)
    ratios, tailed = [], []
    for window in policy.windows[8:-8]:  # past the first windows' fill, before the drain
        seen = window.observation
        if (not window.mean_prefill_s or not seen.request_rate or seen.waiting_requests
                or not seen.mean_running_requests or not seen.mean_input_tokens or not seen.mean_output_tokens):
            continue
        shape = RequestShape(seen.mean_input_tokens, seen.mean_output_tokens)
        expected = estimate_at_observed_load(model, shape, seen.mean_running_requests, seen.request_rate)
        ratios.append(expected.prefill_s / window.mean_prefill_s)
        with_tail = RequestShape.with_assumed_tail(seen.mean_input_tokens, seen.mean_output_tokens, 0.95)
        tailed.append(estimate_at_observed_load(model, with_tail, seen.mean_running_requests,
                                                seen.request_rate).prefill_s / window.mean_prefill_s)
    return statistics.median(ratios), statistics.median(tailed), len(ratios)


def main() -> None:
    rates = [float(r) for r in sys.argv[1:]] or [1.0, 2.0]
    print("expected over observed mean prefill time, one server that is the model (command: .venv/bin/python "
          f"docs/experiments/prefill_one_server.py {' '.join(f'{r:g}' for r in rates)})")
    for rate in rates:
        ratio, tailed, windows = median_ratios(rate)
        print(f"  {rate:g} req/s: median {ratio:.3f} (means only), {tailed:.3f} (with the exponential tail) over "
              f"{windows} windows")


if __name__ == "__main__":
    main()

"""What N replicas behind the simulator's router hold, per replica, against what one replica holds alone
(docs/benchmarks.md, 2026-11-27, ninth session).

Run from the repository root:
    .venv/bin/python docs/experiments/router_pooling.py autoscaling-conv.yaml azure-conv 1,2,3,4,6
    .venv/bin/python docs/experiments/router_pooling.py autoscaling-code.yaml azure-code 1,2,4,6
For each fleet size N: the highest Poisson arrival rate (lengths resampled from the trace, 1,500 x N requests,
bisected to 1/128 of the bracket) at which the fleet of N simulated servers (the benchmark's: true efficiency,
measured-like form, seed 1) holds both SLOs at the resource's percentile, routed as the benchmark routes
(each request to the Ready replica with the fewest in flight). N = 1 is static-peak's load test; kvscale's
goodput model is of one replica with Poisson arrivals, as behind a router that ignores load.
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import autoscaling
from kvscale.cli.simulate_cmd import load_deployment, load_trace
from kvscale.sim.fleet import simulate
from kvscale.sim.loadtest import LOAD_TEST_REQUESTS, LOAD_TEST_SEED, _poisson_trace
from kvscale.sim.policies import StaticPolicy

BISECTION_STEPS = 7


def main() -> None:
    resource, trace_name, sizes = sys.argv[1], sys.argv[2], sys.argv[3]
    deployment = load_deployment(autoscaling.DATA / resource)
    trace = load_trace(trace_name)
    config = replace(autoscaling.CONFIG, tail_s=600.0)
    slo = deployment.spec.slo
    print(f"{resource}: planner goodput {deployment.chosen.goodput_requests_per_s:.3f} req/s per replica "
          "(default efficiency, one replica, Poisson arrivals)")
    for replicas in (int(n) for n in sizes.split(",")):
        def held(rate: float, replicas: int = replicas) -> bool:
            load = _poisson_trace(trace, rate, LOAD_TEST_REQUESTS * replicas, LOAD_TEST_SEED)
            m = simulate(deployment, load, StaticPolicy(replicas, 0.0, 0.0), config).metrics
            ttft, tpot = m["slo_percentile_ttft_ms"], m["slo_percentile_tpot_ms"]
            return (not m["unfinished"] and ttft is not None and ttft <= slo.ttft_ms
                    and (tpot is None or tpot <= slo.tpot_ms))
        low, high = 0.0, float(replicas)
        while held(high):
            low, high = high, 2.0 * high
        for _ in range(BISECTION_STEPS):
            middle = (low + high) / 2.0
            low, high = (middle, high) if held(middle) else (low, middle)
        print(f"{replicas} replicas hold {low:.3f} req/s: {low / replicas:.3f} per replica", flush=True)


if __name__ == "__main__":
    main()

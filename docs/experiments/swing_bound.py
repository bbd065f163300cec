"""How far below static-peak any autoscaler can go on the diurnal day at static-peak's attainment
(issue 14's swing line: 40% fewer GPU-hours at equal attainment, "equal" = within 0.1 points).

Run from the repository root:
    .venv/bin/python docs/experiments/swing_bound.py [--seed 1] [--day-seed 0] [--largest 6]
For one diurnal day (benchmarks/autoscaling.py's DIURNAL, `--day-seed` its arrivals' seed: 0 is the tuning
case, 1 the evaluation one) and one fleet seed (start-up draws, server jitter), it prints static-peak's and
kvscale's attainment and GPU-hours, then the hindsight schedule (benchmarks/autoscaling.py's
hindsight_schedule: the cheapest replica count per block, knowing every block's load in advance, each added
replica started one mean start-up early) at 99% and at static-peak's attainment less 0.1 points, with 5-min
and 1-min blocks. That search is greedy, so beside it the script prints a true lower bound on every
per-block schedule stitched from the same fixed-fleet runs (start-ups free): the Lagrangian dual of choosing
each block's replicas to minimise GPU-hours under the attainment's budget of missed requests. Where even that
bound is above 60% of static-peak's GPU-hours, no policy reaches the swing line on this day.
"""

import argparse
import sys

import numpy as np

from kvscale.sim import Trace

sys.path.insert(0, "benchmarks")


def missed_per_block(trace: Trace, outcomes: list[np.ndarray], block_s: float) -> np.ndarray:
    """Row n-1: requests per block that miss their SLOs with n fixed replicas."""
    blocks = (trace.arrival_s // block_s).astype(np.int64)
    return np.stack([np.bincount(blocks, weights=~met, minlength=int(blocks.max()) + 1) for met in outcomes])


def lower_bound_gpu_hours(trace: Trace, outcomes: list[np.ndarray], block_s: float, target: float,
                          gpus_per_replica: int) -> float:
    """max over lambda >= 0 of sum_b min_n (GPU-h(n, b) + lambda x missed(n, b)) - lambda x budget: the dual
    of the cheapest per-block choice of 1..len(outcomes) replicas missing at most (1 - target) of requests."""
    missed = missed_per_block(trace, outcomes, block_s)
    count = missed.shape[1]
    seconds = np.full(count, block_s)
    seconds[-1] = trace.duration_s - (count - 1) * block_s
    replicas = np.arange(1, len(outcomes) + 1)[:, None]
    cost = replicas * seconds[None, :] * gpus_per_replica / 3600.0
    budget = (1.0 - target) * trace.requests
    lambdas = np.concatenate(([0.0], np.geomspace(1e-6, 1e2, 4000)))
    return float(max(np.min(cost + lam * missed, axis=0).sum() - lam * budget for lam in lambdas))


def main() -> None:
    import autoscaling as bench
    from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation

    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--day-seed", type=int, default=0)
    parser.add_argument("--largest", type=int, default=6)
    args = parser.parse_args()

    bench._use_seed(args.seed)
    deployment = load_deployment(bench.DATA / "autoscaling-conv.yaml")
    trace = load_trace(bench.DIURNAL.replace("seed=0", f"seed={args.day_seed}"))
    static = run_simulation(deployment, trace, "static-peak", config=bench.CONFIG).metrics
    kvscale = run_simulation(deployment, trace, "kvscale", config=bench.CONFIG).metrics
    s_att, s_gpu_h = static["slo_attainment"], static["gpu_hours"]
    print(f"diurnal day seed {args.day_seed}, fleet seed {args.seed}, {trace.requests} requests")
    print(f"  static-peak: {100 * s_att:.2f}% at {s_gpu_h:.2f} GPU-h ({static['max_replicas']} replicas)")
    print(f"  kvscale:     {100 * kvscale['slo_attainment']:.2f}% at {kvscale['gpu_hours']:.2f} GPU-h "
          f"({100 * (1 - kvscale['gpu_hours'] / s_gpu_h):.0f}% fewer)")
    print(f"  the swing line asks for <= {(1 - bench.SWING_SAVING) * s_gpu_h:.2f} GPU-h at >= "
          f"{100 * s_att - bench.EQUAL_ATTAINMENT_PP:.2f}%")
    outcomes = bench.fixed_fleet_outcomes(deployment, trace, args.largest)
    for n, met in enumerate(outcomes, start=1):
        print(f"  fixed fleet of {n}: {100 * met.mean():.2f}%")
    equal = s_att - bench.EQUAL_ATTAINMENT_PP / 100.0
    for block_s in (300.0, 60.0):
        for target in (bench.TARGET_ATTAINMENT, equal):
            found = bench.hindsight_schedule(deployment, trace, args.largest, block_s, target, outcomes)
            if found is None:
                print(f"  schedule, {block_s / 60:g}-min blocks, target {100 * target:.2f}%: not reachable with "
                      f"{args.largest} replicas")
                continue
            bound = lower_bound_gpu_hours(trace, outcomes, block_s, target, deployment.tensor_parallel)
            print(f"  lower bound, {block_s / 60:g}-min blocks, target {100 * target:.2f}%: {bound:.2f} GPU-h "
                  f"({100 * (1 - bound / s_gpu_h):.0f}% fewer than static-peak)")
            per_block, attained, gpu_h = found
            print(f"  schedule, {block_s / 60:g}-min blocks, target {100 * target:.2f}%: {100 * attained:.2f}% at "
                  f"{gpu_h:.2f} GPU-h ({100 * (1 - gpu_h / s_gpu_h):.0f}% fewer than static-peak; mean "
                  f"{sum(per_block) / len(per_block):.2f} replicas)")


if __name__ == "__main__":
    main()

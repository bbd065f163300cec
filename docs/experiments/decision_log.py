"""kvscale's decisions on one simulated benchmark case, one line each (docs/benchmarks.md, 2026-11-27).

Run from the repository root:
    .venv/bin/python docs/experiments/decision_log.py autoscaling-code.yaml azure-code 1.0 1 [--every 60] [--reasons]
Arguments: resource (in benchmarks/data), trace, speed-up, seed. Prints attainment and GPU-hours, then every
decision that changes the fleet and one per `--every` seconds otherwise: Ready and asked-for replicas, the
desired and recommended counts, the binding, the calibrated goodput, the window's arrivals, queue, p99 TTFT
and TPOT; `--reasons` adds each decision's reason; `--pattern-max-period-s` sets the recurring-peak rule's longest
period for the run (docs/experiments/heldout_cycles.sh). Then, per `--block` seconds (default 300), the requests
that missed an SLO under kvscale and under static-peak, and both attainments over the requests sent after the
trace's first peak and a longest start-up (benchmarks/autoscaling.py, first_peak_note).
"""

import argparse
import sys
from dataclasses import replace
from typing import Any

import numpy as np

sys.path.insert(0, "benchmarks")


def main() -> None:
    import kvscale.sim.policies as policies
    from autoscaling import CONFIG, DATA, first_peak_note
    from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation

    parser = argparse.ArgumentParser()
    parser.add_argument("resource")
    parser.add_argument("trace")
    parser.add_argument("speed", type=float)
    parser.add_argument("seed", type=int)
    parser.add_argument("--every", type=float, default=60.0)
    parser.add_argument("--block", type=float, default=300.0)
    parser.add_argument("--reasons", action="store_true")
    parser.add_argument("--pattern-max-period-s", type=float, default=None,
                        help="replaces kvscale.autoscaler.policy.PATTERN_MAX_PERIOD_S for this run")
    args = parser.parse_args()
    if args.pattern_max_period_s is not None:
        import kvscale.autoscaler.policy as policy

        policy.PATTERN_MAX_PERIOD_S = args.pattern_max_period_s  # read at each decision

    log: list[tuple[float, Any, Any, Any]] = []
    original = policies.decide

    def spy(observation: Any, context: Any, history: Any, now_s: float) -> Any:
        decision = original(observation, context, history, now_s)
        log.append((now_s, observation, context, decision))
        return decision

    policies.decide = spy  # the simulator's kvscale policy calls the name in its module
    deployment = load_deployment(DATA / args.resource)
    trace = load_trace(args.trace).sped_up(args.speed)
    config = replace(CONFIG, seed=args.seed, server_form=replace(CONFIG.server_form, seed=args.seed))
    kvscale = run_simulation(deployment, trace, "kvscale", config=config)
    policies.decide = original
    static = run_simulation(deployment, trace, "static-peak", config=config)
    print(f"kvscale: {100 * kvscale.metrics['slo_attainment']:.2f}% at {kvscale.metrics['gpu_hours']:.2f} GPU-h; "
          f"static-peak: {100 * static.metrics['slo_attainment']:.2f}% at {static.metrics['gpu_hours']:.2f}")
    for now_s, obs, ctx, d in log:
        if d.desired_replicas == ctx.current_replicas and now_s % args.every >= 1e-6:
            continue
        ttft = obs.ttft_s if obs is not None and obs.ttft_s is not None else 0.0
        tpot = obs.tpot_s if obs is not None and obs.tpot_s is not None else 0.0
        rate = obs.request_rate if obs is not None and obs.request_rate is not None else 0.0
        waiting = obs.waiting_requests if obs is not None and obs.waiting_requests is not None else 0.0
        print(f"{now_s:7.0f} ready {ctx.ready_replicas:2d} asked {ctx.current_replicas:2d} -> {d.desired_replicas:2d} "
              f"rec {d.recommended_replicas:2d} {d.binding:13s} goodput {d.goodput_requests_per_s or 0:5.2f} "
              f"rate {rate:5.2f} waiting {waiting:5.1f} p99 TTFT {1000 * ttft:6.0f} ms TPOT {1000 * tpot:5.1f} ms")
        if args.reasons:
            print("       ", d.reason)
    blocks = (trace.arrival_s // args.block).astype(np.int64)
    arrivals = np.bincount(blocks)
    missed = {name: np.bincount(blocks, weights=~result.met_slo, minlength=arrivals.size)
              for name, result in (("kvscale", kvscale), ("static-peak", static))}
    print(f"requests that missed an SLO per {args.block:g} s (blocks with any):")
    for i, count in enumerate(arrivals):
        if missed["kvscale"][i] + missed["static-peak"][i] > 0:
            print(f"{i * args.block:7.0f} arrivals {count:5d} kvscale {missed['kvscale'][i]:4.0f} "
                  f"static-peak {missed['static-peak'][i]:4.0f}")
    print(f"total: kvscale {missed['kvscale'].sum():.0f}, static-peak {missed['static-peak'].sum():.0f} "
          f"of {arrivals.sum()}")
    print(first_peak_note("split", trace.arrival_s, {"kvscale": kvscale.met_slo, "static-peak": static.met_slo}))


if __name__ == "__main__":
    main()

"""kvscale on one simulated shape with the recurring-peak rule's longest period set (docs/benchmarks.md, 2026-11-29).

Run from the repository root:
    .venv/bin/python docs/experiments/pattern_period.py RESOURCE TRACE SEED PERIOD_S [--static]
RESOURCE is in benchmarks/data; the simulated servers and start-ups are the benchmark's (benchmarks/autoscaling.py
CONFIG) at simulator seed SEED; PERIOD_S replaces kvscale.autoscaler.policy.PATTERN_MAX_PERIOD_S for this run.
Prints kvscale's attainment and GPU-hours, and static-peak's with --static.
"""

import argparse
import sys
from dataclasses import replace

sys.path.insert(0, "benchmarks")


def main() -> None:
    import kvscale.autoscaler.policy as policy
    from autoscaling import CONFIG, DATA
    from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation

    parser = argparse.ArgumentParser()
    parser.add_argument("resource")
    parser.add_argument("trace")
    parser.add_argument("seed", type=int)
    parser.add_argument("period_s", type=float)
    parser.add_argument("--static", action="store_true")
    args = parser.parse_args()
    policy.PATTERN_MAX_PERIOD_S = args.period_s  # read at each decision, so the module's name is the knob
    deployment = load_deployment(DATA / args.resource)
    trace = load_trace(args.trace)
    config = replace(CONFIG, seed=args.seed, server_form=replace(CONFIG.server_form, seed=args.seed))
    kvscale = run_simulation(deployment, trace, "kvscale", config=config)
    line = (f"period {args.period_s:.0f} s: kvscale {100 * kvscale.metrics['slo_attainment']:.2f}% at "
            f"{kvscale.metrics['gpu_hours']:.2f} GPU-h")
    if args.static:
        static = run_simulation(deployment, trace, "static-peak", config=config)
        line += f"; static-peak {100 * static.metrics['slo_attainment']:.2f}% at {static.metrics['gpu_hours']:.2f}"
    print(line)


if __name__ == "__main__":
    main()

"""Where kvscale's misses fall on the autoscaling benchmark: in a deployment's first minutes, or after.

Run from the repository root:
    .venv/bin/python docs/experiments/cold_start.py [--seed 1] [--warm-s 600] [--initial-factor 1] [--jobs 2]

For every case of benchmarks/autoscaling.py but the three-day one (its first minutes are 0.2% of it), it runs
kvscale and static-peak as that benchmark does (same fleet configuration, start-up draws and servers; `--seed`
is its `--seed`) and prints, per policy, the attainment over the whole trace, the share of its missed requests
that arrived in the first `--warm-s` seconds of the replay (default 600 s: the longest drawn start-up, 300 s,
plus the 300-s scale-down window), the attainment of the requests that arrived after them, and the GPU-hours.
Beside kvscale's row: the fewest fixed replicas (1 to 3 x maxReplicas, run whole as static-peak is) whose
attainment after the first minutes is at least kvscale's there, and their GPU-hours: whether kvscale's fleet
costs more than a fixed one once both have served the same requests as well. kvscale starts from the plan
for the resource's stated load (the policies' `initial_replicas`); static-peak is sized in hindsight from
the replay's peak minute. `--initial-factor F` starts kvscale with F x the planned replicas instead
(bounded by maxReplicas): what a fleet started above the stated load would change.
"""

from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import autoscaling
from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation
from kvscale.sim import SimulatedDeployment, Trace, simulate
from kvscale.sim.policies import StaticPolicy

POLICIES = ("kvscale", "static-peak")


def _after(met: np.ndarray, early: np.ndarray) -> float:
    """Attainment of the requests that arrived after the first minutes."""
    late = ~early
    return float(met[late].mean()) if late.any() else float("nan")


def matched_fixed_fleet(deployment: SimulatedDeployment, replayed: Trace, early: np.ndarray, target: float,
                        largest: int) -> str:
    """The fewest fixed replicas reaching `target` attainment after the first minutes, and their GPU-hours."""
    for replicas in range(1, largest + 1):
        result = simulate(deployment, replayed, StaticPolicy(replicas, 0.0, 0.0), autoscaling.CONFIG)
        if _after(np.asarray(result.met_slo, dtype=bool), early) >= target - 1e-12:
            return f"{replicas} at {result.metrics['gpu_hours']:.2f}"
    return f"none of 1-{largest}"


def run_case(args: tuple[autoscaling.Case, int, float, float]) -> list[str]:
    case, seed, warm_s, initial_factor = args
    autoscaling._use_seed(seed)
    deployment = load_deployment(autoscaling.DATA / case.resource)
    trace = load_trace(case.trace)
    replayed = trace.sped_up(case.speedup)
    early = replayed.arrival_s < warm_s
    rows = []
    for policy in POLICIES:
        initial = None
        if policy == "kvscale" and initial_factor != 1.0:
            initial = min(math.ceil(initial_factor * deployment.chosen.replicas - 1e-9),
                          deployment.spec.scaling.max_replicas)
        result = run_simulation(deployment, trace, policy, speedup=case.speedup, config=autoscaling.CONFIG,
                                initial_replicas=initial)
        met = np.asarray(result.met_slo, dtype=bool)
        missed = ~met
        share = missed[early].sum() / max(int(missed.sum()), 1)
        after = _after(met, early)
        start = f" (from {initial})" if initial is not None else ""
        fixed = (matched_fixed_fleet(deployment, replayed, early, after, 3 * deployment.spec.scaling.max_replicas)
                 if policy == "kvscale" else "")
        rows.append(f"| {case.split} | {case.label} | {policy}{start} | {100 * met.mean():.2f}% | "
                    f"{int(missed.sum()):,} | {100 * share:.0f}% | {100 * after:.2f}% | "
                    f"{result.metrics['gpu_hours']:.2f} | {fixed} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=autoscaling.STARTUP_SEED)
    parser.add_argument("--warm-s", type=float, default=600.0)
    parser.add_argument("--initial-factor", type=float, default=1.0)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    cases = [c for c in autoscaling.CASES if "static-peak" in c.policies and c.references]
    print(f"seed {args.seed}; first minutes: requests arriving in the first {args.warm_s:.0f} s of each replay")
    print("| set | case | policy | attainment | missed | of them in the first minutes | attainment after them "
          "| GPU-hours | fixed fleet as good after them: replicas at GPU-hours |")
    print("|---|---|---|---|---|---|---|---|---|")
    jobs = [(c, args.seed, args.warm_s, args.initial_factor) for c in cases]
    with ProcessPoolExecutor(max(args.jobs, 1)) as pool:
        for rows in pool.map(run_case, jobs):
            print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()

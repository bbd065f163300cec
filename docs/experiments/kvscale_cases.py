"""kvscale alone on benchmark cases over fleet seeds: SLO attainment and GPU-hours over the trace's span.

Run from the repository root (docs/benchmarks.md, 2026-12-02):
    .venv/bin/python docs/experiments/kvscale_cases.py tuning 1,2
The first argument is a split (tuning, evaluation) or a substring of the cases' labels; the week is left out.
For a variant: PYTHONPATH=<worktree>/operator runs another checkout's package, and SET_<NAME>=<number> sets
that constant of kvscale.autoscaler.calibration in each worker first (as the variants in
docs/experiments/2026-12-02-tail-and-prefill-variants.diff read theirs). JOBS=<n> workers (default 2).
"""

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

sys.path.insert(0, "benchmarks")


def one(job: tuple[int, int]) -> tuple[int, int, float, float]:
    import autoscaling as bench
    import kvscale.autoscaler.calibration as calibration
    from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation

    for key, value in os.environ.items():
        if key.startswith("SET_"):
            setattr(calibration, key[4:], float(value))
    index, seed = job
    case = bench.CASES[index]
    config = replace(bench.CONFIG, seed=seed, server_form=replace(bench.CONFIG.server_form, seed=seed))
    metrics = run_simulation(load_deployment(bench.DATA / case.resource), load_trace(case.trace), "kvscale",
                             speedup=case.speedup, config=config).metrics
    return index, seed, 100 * metrics["slo_attainment"], metrics["trace_gpu_hours"]


def main() -> None:
    import autoscaling as bench

    which, seeds = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    chosen = [i for i, case in enumerate(bench.CASES) if case.title != "weekly-3d"
              and (case.split == which or (which not in ("tuning", "evaluation") and which in case.label))]
    jobs = sorted(((i, s) for i in chosen for s in seeds), key=lambda job: "diurnal" not in bench.CASES[job[0]].label)
    with ProcessPoolExecutor(int(os.environ.get("JOBS", "2"))) as pool:
        for index, seed, attainment, gpu_hours in pool.map(one, jobs):
            case = bench.CASES[index]
            print(f"{case.split:10s} {case.label:40s} seed {seed} {attainment:7.3f}% {gpu_hours:7.3f} GPU-h",
                  flush=True)


if __name__ == "__main__":
    main()

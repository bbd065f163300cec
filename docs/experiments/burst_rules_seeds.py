"""Seed means of one policy over simulated cases (docs/benchmarks.md, "Held-out traffic", 2026-11-26).

Run from the repository root:
    .venv/bin/python docs/experiments/burst_rules_seeds.py "autoscaling-code.yaml|azure-code|0.75;..." 1,2,3,4
Each case is resource (in benchmarks/data) | trace | speed-up.
POLICY=static-peak runs static-peak; TAG=x labels the rows.
"""

import collections
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

sys.path.insert(0, "benchmarks")

Case = tuple[str, str, float]


def one(job: tuple[str, str, float, int]) -> tuple[Case, int, float, float]:
    from autoscaling import CONFIG, DATA
    from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation

    resource, trace_name, speed, seed = job
    deployment = load_deployment(DATA / resource)
    trace = load_trace(trace_name).sped_up(speed)
    config = replace(CONFIG, seed=seed, server_form=replace(CONFIG.server_form, seed=seed))
    metrics = run_simulation(deployment, trace, os.environ.get("POLICY", "kvscale"), config=config).metrics
    return (resource, trace_name, speed), seed, 100 * metrics["slo_attainment"], metrics["gpu_hours"]


def main() -> None:
    cases: list[Case] = []
    for text in sys.argv[1].split(";"):
        resource, trace_name, speed = text.split("|")
        cases.append((resource, trace_name, float(speed)))
    seeds = [int(x) for x in sys.argv[2].split(",")]
    jobs = [(*case, seed) for case in cases for seed in seeds]
    runs: dict[Case, list[tuple[float, float]]] = collections.defaultdict(list)
    with ProcessPoolExecutor(2) as pool:
        for case, _, attainment, gpu_hours in pool.map(one, jobs):
            runs[case].append((attainment, gpu_hours))
    tag = os.environ.get("TAG", "")
    for case in cases:
        got = runs[case]
        mean_attainment = sum(a for a, _ in got) / len(got)
        mean_gpu_hours = sum(g for _, g in got) / len(got)
        per_seed = " ".join(f"{a:.2f}/{g:.1f}" for a, g in got)
        print(f"{tag:8s} {case[0]:28s} {case[1][:40]:40s} x{case[2]:g} att {mean_attainment:6.2f}% "
              f"gpuh {mean_gpu_hours:7.2f}  {per_seed}", flush=True)


if __name__ == "__main__":
    main()

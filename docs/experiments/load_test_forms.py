"""static-peak's load test on servers of the model's form and of the benchmark's measured-like form, per case
(docs/benchmarks.md, 2026-12-02): the capacity per replica it reads and the fleet it sizes.

Run from the repository root:
    .venv/bin/python docs/experiments/load_test_forms.py
Until 2026-12-02 `kvscale simulate` load-tested servers of the model's form whatever the run's servers were.
"""

import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, "benchmarks")


def one(index: int) -> str:
    import autoscaling as bench
    from kvscale.cli.simulate_cmd import load_deployment, load_trace
    from kvscale.sim.loadtest import static_for_peak
    from kvscale.sim.server import MODEL_FORM

    case = bench.CASES[index]
    deployment = load_deployment(bench.DATA / case.resource)
    trace = load_trace(case.trace).sped_up(case.speedup)
    as_modelled = static_for_peak(deployment, trace, MODEL_FORM)
    measured_like = static_for_peak(deployment, trace, bench.CONFIG.server_form)
    return (f"| {case.split} | {case.label} | {as_modelled.capacity:.3f} req/s, {as_modelled.replicas} replicas | "
            f"{measured_like.capacity:.3f} req/s, {measured_like.replicas} replicas |")


def main() -> None:
    import autoscaling as bench

    print("| set | case | load test on model-form servers | on measured-like servers (the run's) |")
    print("|---|---|---|---|")
    with ProcessPoolExecutor(2) as pool:
        for line in pool.map(one, range(len(bench.CASES))):
            print(line, flush=True)


if __name__ == "__main__":
    main()

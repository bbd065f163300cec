"""How the servers' percentiles compare with the calibrated model's, by load: the ratio calibration learns as
one tail factor (kvscale.autoscaler.calibration), split by the share of a replica's saturation rate each
window ran at.

Run from the repository root:
    .venv/bin/python docs/experiments/tail_by_load.py [--only SUBSTRING] [--seed 1] [--jobs 2]

The question it answers: one tail factor is learned from every steady window whatever its load, and applied
where the goodput is, at the load the policy sizes a replica for. If the ratio of observed to modelled
percentile moves with load, a factor learned at light load misstates the goodput. Each benchmark case
(benchmarks/autoscaling.py, its servers and fleet seed) runs kvscale's policy once; every window calibration
takes tails from (steady: no queue, no replica starting; neither bursty nor overloaded) is recorded with the
ratio the calibration step computes (observed SLO-percentile TPOT and TTFT over the model's at the window's
per-replica rate, the model at the step's own speed factors) and the window's load, its rate over the model's
max_request_rate. Prints, per case and load band, the windows, their TPOT tail weight (the evidence calibration
gives them) and the weighted geometric mean of each ratio.
"""

from __future__ import annotations

import itertools
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

sys.path.insert(0, "benchmarks")

BAND_EDGES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)

Window = tuple[float, float, float, float, float]  # load share, TPOT ratio, TTFT ratio, their tail weights


def run_one(index: int, seed: int) -> list[Window]:
    import autoscaling as bench
    import kvscale.sim.policies as policies
    from kvscale.autoscaler.calibration import TTFT_TAIL_EVIDENCE_REQUESTS
    from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation
    from kvscale.perfmodel import build_replica_model, estimate_at_rate
    from kvscale.perfmodel.serving import max_request_rate

    bench._use_seed(seed)
    case = bench.CASES[index]
    windows: list[Window] = []
    original = policies.calibrate

    def recording(previous: Any, setup: Any, sample: Any) -> Any:
        updated = original(previous, setup, sample)
        rate = sample.rate_per_replica
        if sample.bursty or sample.overloaded or not sample.steady or not rate or updated.samples == previous.samples:
            return updated
        speed = replace(previous, decode_factor=updated.decode_factor, prefill_factor=updated.prefill_factor)
        model = build_replica_model(replace(setup, efficiency=speed.efficiency(setup.efficiency)))
        at = estimate_at_rate(model, sample.shape, rate, sample.slots, sample.quantile)
        if not bool(at.stable):
            return updated
        tpot = sample.tpot_quantile_s / float(at.tpot_quantile_s) if sample.tpot_quantile_s else math.nan
        ttft = sample.ttft_quantile_s / float(at.ttft_quantile_s) if sample.ttft_quantile_s else math.nan
        load = rate / float(max_request_rate(model, sample.shape, [sample.slots])[0])
        windows.append((load, tpot, ttft, sample.tail_weight(), sample.tail_weight(TTFT_TAIL_EVIDENCE_REQUESTS)))
        return updated

    policies.calibrate = recording
    try:
        run_simulation(load_deployment(bench.DATA / case.resource), load_trace(case.trace), "kvscale",
                       speedup=case.speedup, config=bench.CONFIG)
    finally:
        policies.calibrate = original
    return windows


def weighted_geomean(pairs: list[tuple[float, float]]) -> float:
    kept = [(math.log(value), weight) for value, weight in pairs if value > 0 and weight > 0]
    total = sum(weight for _, weight in kept)
    return math.exp(sum(v * w for v, w in kept) / total) if total else math.nan


def main() -> None:
    import autoscaling as bench

    args = bench.experiment_arguments(__doc__.split("\n\n")[0]).parse_args()
    chosen = bench.referenced_cases(args.only)
    print(f"observed over modelled SLO-percentile latency, by load (rate over the calibrated model's saturation rate), "
          f"fleet seed {args.seed} (command: .venv/bin/python docs/experiments/tail_by_load.py --seed {args.seed})")
    print("| set | case | load | windows | TPOT tail weight | TPOT ratio | TTFT ratio |")
    print("|---|---|---|---|---|---|---|")
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run_one, chosen, [args.seed] * len(chosen)))
    for index, windows in zip(chosen, results, strict=True):
        case = bench.CASES[index]
        for low, high in itertools.pairwise(BAND_EDGES):
            band = [w for w in windows if low <= w[0] < high or (high == BAND_EDGES[-1] and w[0] >= high)]
            weight = sum(w[3] for w in band)
            if weight < 1.0:
                continue  # less than one full window's evidence: noise
            tpot = weighted_geomean([(w[1], w[3]) for w in band if not math.isnan(w[1])])
            ttft = weighted_geomean([(w[2], w[4]) for w in band if not math.isnan(w[2])])
            print(f"| {case.split} | {case.label} | {low:.1f}-{high:.1f} | {len(band)} | {weight:.1f} | {tpot:.3f} | "
                  f"{ttft:.3f} |", flush=True)


if __name__ == "__main__":
    main()

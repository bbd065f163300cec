"""Where the tail factors' fall with load comes from: the calibrated prefill speed, measured against servers
whose true speed is known.

Run from the repository root:
    .venv/bin/python docs/experiments/prefill_fit_bias.py --exact [--random-router] [--poisson-arrivals]
        [--only SUBSTRING] [--seed 1] [--jobs 2]

Each benchmark case (benchmarks/autoscaling.py, its fleet seed) runs kvscale's policy once. With `--exact` the
simulated servers are the planner's own model (its efficiency factors and its form: no scale or form error), so
the right speed factors are 1 and the model at them is the truth; without it they are the benchmark's servers
(TRUE_SERVER_EFFICIENCY: decode 0.8, prefill 0.85, in the measured-like form), whose true model kvscale does not
have. Prints, per case:
- the decode and prefill factors calibration learned (p10 / p50 / p90 over its windows);
- with `--exact`: the true model's mean prefill time over the one observed (vLLM's request_prefill_time_seconds:
  a prompt's first scheduled step to its first token), as calibration computes it, p10 / p50 / p90;
- per load band, the observed over modelled SLO-percentile TPOT and TTFT (as docs/experiments/tail_by_load.py),
  at the calibrated factors and, with `--exact`, at the true ones.
`--random-router` sends each request to a Ready replica drawn at random (a plain Service) instead of the one with
the fewest requests in flight, and `--poisson-arrivals` replaces the trace's arrival times with as many uniform
ones over its span (its lengths kept, in order): the two ways the fleet differs from the one-replica,
Poisson-arrival model beyond the servers' speed.

Since the thirty-third session the expectation is the shared-steps one (docs/benchmarks.md): the thirty-second
session's diff, docs/experiments/2026-12-01-prefill-shared-steps-and-mix.diff, landed; its "as shipped" figures
come from the commit before it (56ec658).
"""

from __future__ import annotations

import itertools
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "docs/experiments")

from tail_by_load import BAND_EDGES, weighted_geomean


@dataclass
class Record:
    factors: list[tuple[float, float]] = field(default_factory=list)  # (decode, prefill) after each step
    prefill_ratios: list[float] = field(default_factory=list)  # the true model's mean prefill / observed
    # (load, TPOT ratio at calibrated, TTFT ratio at calibrated, TPOT at true, TTFT at true, tail weight)
    windows: list[tuple[float, float, float, float, float, float]] = field(default_factory=list)


def _ratios(model: Any, sample: Any, rate: float) -> tuple[float, float] | None:
    from kvscale.perfmodel import estimate_at_rate

    at = estimate_at_rate(model, sample.shape, rate, sample.slots, sample.quantile)
    if not bool(at.stable):
        return None
    tpot = sample.tpot_quantile_s / float(at.tpot_quantile_s) if sample.tpot_quantile_s else math.nan
    ttft = sample.ttft_quantile_s / float(at.ttft_quantile_s) if sample.ttft_quantile_s else math.nan
    return tpot, ttft


def _random_route(fleet: Any, req: int) -> None:
    """The fleet's router with the least-loaded choice replaced by a random Ready replica."""
    log = fleet.log
    prompt, out = int(log.input_tokens[req]), int(log.output_tokens[req])
    if prompt + out > fleet.request_limit:
        log.dropped[req] = True
        return
    if not fleet.ready:
        fleet.pending.append(req)
        return
    fleet.ready[int(fleet.rng.integers(len(fleet.ready)))].submit(req, prompt, out)


def run_one(index: int, seed: int, exact: bool, random_router: bool, poisson_arrivals: bool) -> Record:
    import numpy as np

    import autoscaling as bench
    import kvscale.sim.fleet as fleet
    import kvscale.sim.policies as policies
    from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation
    from kvscale.perfmodel import build_replica_model, estimate_at_observed_load
    from kvscale.perfmodel.serving import max_request_rate
    from kvscale.sim.server import MODEL_FORM

    bench._use_seed(seed)
    config = replace(bench.CONFIG, server_form=replace(MODEL_FORM, seed=seed)) if exact else bench.CONFIG
    case = bench.CASES[index]
    deployment = load_deployment(bench.DATA / case.resource)
    if exact:
        deployment = replace(deployment, server_setup=replace(deployment.server_setup,
                                                              efficiency=deployment.setup.efficiency))
    record = Record()
    original = policies.calibrate

    def recording(previous: Any, setup: Any, sample: Any) -> Any:
        updated = original(previous, setup, sample)
        if updated.samples == previous.samples:
            return updated
        record.factors.append((updated.decode_factor, updated.prefill_factor))
        rate = sample.rate_per_replica
        if sample.bursty or sample.overloaded or not rate:
            return updated
        true_model = build_replica_model(setup)
        if exact and sample.prefill_mean_s and not sample.queued:
            predicted = estimate_at_observed_load(true_model, sample.shape, sample.running_per_replica, rate)
            record.prefill_ratios.append(predicted.prefill_s / sample.prefill_mean_s)
        if not sample.steady:
            return updated
        speed = replace(previous, decode_factor=updated.decode_factor, prefill_factor=updated.prefill_factor)
        calibrated = build_replica_model(replace(setup, efficiency=speed.efficiency(setup.efficiency)))
        at_calibrated = _ratios(calibrated, sample, rate)
        at_true = _ratios(true_model, sample, rate) if exact else (math.nan, math.nan)
        if at_calibrated is None or at_true is None:
            return updated
        load = rate / float(max_request_rate(calibrated, sample.shape, [sample.slots])[0])
        record.windows.append((load, *at_calibrated, *at_true, sample.tail_weight))
        return updated

    trace = load_trace(case.trace)
    if poisson_arrivals:
        arrivals = np.sort(np.random.default_rng(seed).uniform(0.0, float(trace.arrival_s[-1]), trace.requests))
        trace = replace(trace, arrival_s=arrivals)
    if random_router:
        fleet._Fleet.route = _random_route  # type: ignore[method-assign]
    policies.calibrate = recording
    try:
        run_simulation(deployment, trace, "kvscale", speedup=case.speedup, config=config)
    finally:
        policies.calibrate = original
    return record


def _spread(values: list[float]) -> str:
    import numpy as np

    if not values:
        return "-"
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return f"{p50:.3f} ({p10:.3f}-{p90:.3f})"


def main() -> None:
    import autoscaling as bench

    parser = bench.experiment_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--exact", action="store_true", help="servers are the planner's own model")
    parser.add_argument("--random-router", action="store_true", help="each request to a random Ready replica")
    parser.add_argument("--poisson-arrivals", action="store_true", help="uniform arrival times in place of the trace's")
    args = parser.parse_args()
    chosen = bench.referenced_cases(args.only)
    flags = "".join(f" --{name}" for name, on in (("exact", args.exact), ("random-router", args.random_router),
                                                   ("poisson-arrivals", args.poisson_arrivals)) if on)
    print(f"calibration, fleet seed {args.seed} (command: .venv/bin/python docs/experiments/prefill_fit_bias.py{flags} "
          f"--seed {args.seed})")
    count = len(chosen)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        records = list(pool.map(run_one, chosen, [args.seed] * count, [args.exact] * count,
                                [args.random_router] * count, [args.poisson_arrivals] * count))
    print("| set | case | windows | decode factor p50 (p10-p90) | prefill factor | true prefill / observed |")
    print("|---|---|---|---|---|---|")
    for index, record in zip(chosen, records, strict=True):
        case = bench.CASES[index]
        print(f"| {case.split} | {case.label} | {len(record.factors)} | {_spread([f[0] for f in record.factors])} | "
              f"{_spread([f[1] for f in record.factors])} | {_spread(record.prefill_ratios)} |")
    print("\n| set | case | load | windows | TPOT ratio, calibrated | TTFT ratio, calibrated | TPOT ratio, true | "
          "TTFT ratio, true |")
    print("|---|---|---|---|---|---|---|---|")
    for index, record in zip(chosen, records, strict=True):
        case = bench.CASES[index]
        for low, high in itertools.pairwise(BAND_EDGES):
            band = [w for w in record.windows if low <= w[0] < high or (high == BAND_EDGES[-1] and w[0] >= high)]
            if sum(w[5] for w in band) < 1.0:
                continue  # less than one full window's evidence: noise
            means = [weighted_geomean([(w[k], w[5]) for w in band if not math.isnan(w[k])]) for k in (1, 2, 3, 4)]
            print(f"| {case.split} | {case.label} | {low:.1f}-{high:.1f} | {len(band)} | "
                  + " | ".join(f"{m:.3f}" for m in means) + " |", flush=True)


if __name__ == "__main__":
    main()

"""Fit the default efficiency factors to the published measurements, and cross-validate the fit.

    .venv/bin/python benchmarks/fit_efficiency.py

Coordinate descent on a few physical factors (achieved HBM bandwidth for weights and for the KV
cache, achieved tensor throughput, per-step overhead), minimising the mean of the per-metric median
absolute % errors. Leave-one-source-out: each source's figures are predicted with factors fitted
without that source, so the printed cross-validated error is out of sample.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from typing import Any

from accuracy import Comparison, load_measurements, median_errors, predict_measurement
from kvscale.perfmodel import DEFAULT_EFFICIENCY, EfficiencyFactors

GRID: dict[str, tuple[float, ...]] = {
    "hbm_bandwidth": (0.65, 0.7, 0.75, 0.8, 0.85, 0.9),
    "attention_bandwidth": (0.5, 0.6, 0.7, 0.8, 0.9),
    "compute": (0.4, 0.5, 0.6, 0.7, 0.8),
    "step_overhead_s": (0.5e-3, 1.0e-3, 1.5e-3, 2.0e-3, 3.0e-3),
}


def score(measurements: list[dict[str, Any]], factors: EfficiencyFactors) -> float:
    comparisons: list[Comparison] = []
    for m in measurements:
        comparisons.extend(predict_measurement(m, factors))
    medians = [error for error, count in median_errors(comparisons).values() if count]
    return statistics.mean(medians)


def fit(measurements: list[dict[str, Any]], start: EfficiencyFactors = DEFAULT_EFFICIENCY,
        rounds: int = 2) -> EfficiencyFactors:
    best, best_score = start, score(measurements, start)
    for _ in range(rounds):
        for name, values in GRID.items():
            for value in values:
                trial = replace(best, **{name: value})
                trial_score = score(measurements, trial)
                if trial_score < best_score - 1e-9:
                    best, best_score = trial, trial_score
    return best


def source_of(m: dict[str, Any]) -> str:
    return str(m["source"]).split("#")[0]


def main() -> int:
    measurements = load_measurements()
    fitted = fit(measurements)
    print("fitted factors:", {k: getattr(fitted, k) for k in GRID})
    print(f"in-sample score (mean of medians): default {score(measurements, DEFAULT_EFFICIENCY):.1f}%, "
          f"fitted {score(measurements, fitted):.1f}%")
    sources = sorted({source_of(m) for m in measurements})
    held_out: list[Comparison] = []
    for source in sources:
        train = [m for m in measurements if source_of(m) != source]
        factors = fit(train, fitted, rounds=1)
        for m in measurements:
            if source_of(m) == source:
                held_out.extend(predict_measurement(m, factors))
    print(f"leave-one-source-out ({len(sources)} sources):")
    for name, (error, count) in median_errors(held_out).items():
        print(f"  median absolute % error, {name:<40} {error:6.1f}%  (n={count})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

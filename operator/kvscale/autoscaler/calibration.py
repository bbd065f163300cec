"""Online calibration: fit the model's decode and prefill speed to what the servers show.

The performance model predicts TPOT at the observed batch and prefill time for the observed prompts;
the ratio to the observed values says how much faster or slower this deployment really is. Ratios
are bounded (a single odd sample never swings the model by more than the bounds) and smoothed
(exponentially, so a step change is followed within a few cycles without chasing noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvscale.perfmodel import (
    EfficiencyFactors,
    RequestShape,
    ServingSetup,
    build_replica_model,
    estimate_at_concurrency,
)

FACTOR_BOUNDS = (0.25, 4.0)  # the model may be off by 4x either way, not more
SMOOTHING = 0.3  # weight of the newest sample
MIN_RUNNING_FOR_DECODE_FIT = 1.0


@dataclass(frozen=True)
class Calibration:
    """Speed factors (>1: the servers are faster than the defaults) and the last prediction errors."""

    decode_factor: float = 1.0
    prefill_factor: float = 1.0
    tpot_error_pct: float | None = None  # (predicted - observed) / observed before this update
    ttft_error_pct: float | None = None
    samples: int = 0

    def efficiency(self, base: EfficiencyFactors) -> EfficiencyFactors:
        return base.scaled(decode=self.decode_factor, prefill=self.prefill_factor)


def _bounded(value: float) -> float:
    low, high = FACTOR_BOUNDS
    return min(max(value, low), high)


def _smoothed(previous: float, target: float, first: bool) -> float:
    if first:
        return _bounded(target)
    # Smooth in log space: a 2x and a 0.5x surprise pull equally hard.
    log_value = (1 - SMOOTHING) * math.log(previous) + SMOOTHING * math.log(_bounded(target))
    return _bounded(math.exp(log_value))


def calibrate(previous: Calibration, setup: ServingSetup, shape: RequestShape, running_per_replica: float,
              observed_tpot_s: float | None, observed_prefill_s: float | None) -> Calibration:
    """One calibration step from one observation; unchanged when there is nothing to learn from."""
    model = build_replica_model(replace(setup, efficiency=previous.efficiency(setup.efficiency)))
    decode, tpot_error = previous.decode_factor, None
    if observed_tpot_s and running_per_replica >= MIN_RUNNING_FOR_DECODE_FIT:
        predicted = float(estimate_at_concurrency(model, shape, running_per_replica).tpot_mean_s)
        tpot_error = (predicted - observed_tpot_s) / observed_tpot_s * 100.0
        decode = _smoothed(previous.decode_factor, previous.decode_factor * predicted / observed_tpot_s,
                           previous.samples == 0)
    prefill, ttft_error = previous.prefill_factor, None
    if observed_prefill_s:
        predicted_prefill = float(model.prefill_s(shape.input_tokens))
        ttft_error = (predicted_prefill - observed_prefill_s) / observed_prefill_s * 100.0
        prefill = _smoothed(previous.prefill_factor, previous.prefill_factor * predicted_prefill / observed_prefill_s,
                            previous.samples == 0)
    if tpot_error is None and ttft_error is None:
        return previous
    return Calibration(decode_factor=decode, prefill_factor=prefill, tpot_error_pct=tpot_error,
                       ttft_error_pct=ttft_error, samples=previous.samples + 1)

"""The planner's per-GPU capacity against a measured-kernel planner's (benchmarks/capacity.py, issue 13 part 5):
the spec it plans is the stated setting, a stricter percentile never buys capacity, and the gap stays in the
band docs/accuracy.md explains (kvscale conservative by the tensor factor, not above the kernel sums)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from benchmarks_loader import load_benchmark

# Measured 2026-11-28: -18.6% to -8.9% of AIConfigurator's figures at p95 and p50. Above the kernel sums, or
# more than a quarter below them, the model has moved away from what docs/accuracy.md explains.
LOWEST_SHARE = 0.75
HIGHEST_SHARE = 1.0


def test_the_case_spec_is_the_stated_setting() -> None:
    capacity = load_benchmark("capacity")
    case = capacity.CASES[1]
    spec = capacity.case_spec(case, 95.0)
    assert spec.model.name == case.model and spec.serving.tensor_parallel == case.tensor_parallel
    assert (spec.slo.ttft_ms, spec.slo.tpot_ms, spec.slo.percentile) == (1000, 50, 95.0)
    assert (spec.workload.input_tokens, spec.workload.output_tokens) == (1024, 256)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_capacity_sits_below_the_kernel_sums_within_a_band_and_a_stricter_percentile_costs_capacity(
        index: int) -> None:
    capacity = load_benchmark("capacity")
    case = capacity.CASES[index]
    p95 = capacity.tokens_per_s_per_gpu(case, 95.0)
    p50 = capacity.tokens_per_s_per_gpu(case, 50.0)
    assert 0.0 < p95 <= p50
    for ours in (p95, p50):
        share = ours / case.reference_tokens_per_s_per_gpu
        assert LOWEST_SHARE <= share <= HIGHEST_SHARE, (case.model, round(share, 3))

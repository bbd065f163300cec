"""The planner's promise against kvscale's fleet simulator running the planned configuration at the
planner's own efficiency (benchmarks/model_vs_sim.py; docs/accuracy.md has the full table).

The simulator steps a continuous-batching engine request by request, four seeded runs pooled per point
(one run's p99 moves 5-8% between seeds); the model is closed-form. Issue 13's set, the packaged Azure
traces and a long-prompt trace, at half and nine tenths of the planned goodput: every SLO percentile
agrees within 10% (the largest, 2026-11-29: -8%). The shared-prefix trace, outside that set: within 20%
(its TTFT is over-predicted by 12-18%; docs/accuracy.md says why). The median error of each of TTFT and
TPOT over all 16 figures is at most 8% (6.5% and 4.0% then).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvscale.perfmodel import build_replica_model, estimate_at_rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from benchmarks_loader import load_benchmark

BENCH = load_benchmark("model_vs_sim")
LOADS = (0.5, 0.9)
ISSUE_SET = 0.10  # the packaged traces and the long-prompt one
EVERY_POINT = 0.20
MEDIAN = 0.08


@pytest.fixture(scope="module")
def points() -> list:  # type: ignore[type-arg]
    return [p for case in BENCH.CASES for p in BENCH.compare(case, LOADS)]


def test_every_case_and_load_is_compared(points: list) -> None:  # type: ignore[type-arg]
    assert {p.case for p in points} == {c.name for c in BENCH.CASES}
    assert all(p.sim_ttft_ms > 0 and p.sim_tpot_ms > 0 for p in points)


@pytest.mark.parametrize("metric", ["ttft", "tpot"])
def test_the_promise_holds_in_the_simulator(points: list, metric: str) -> None:  # type: ignore[type-arg]
    errors = {(p.case, p.load): getattr(p, f"{metric}_error") for p in points}
    for (case, load), error in errors.items():
        bound = EVERY_POINT if case.startswith("shared prefixes") else ISSUE_SET
        assert abs(error) <= bound, f"{metric} off by {error:+.0%} at {case}, {load:g} of goodput"
    assert statistics.median(abs(e) for e in errors.values()) <= MEDIAN


def test_shared_prefixes_are_what_the_hit_rate_makes_of_them() -> None:
    """The shared-prefix trace: the simulator's prefix cache finds most prompt tokens (as vLLM's
    prefix_cache_hits / queries counters would say), and the model needs that rate: without it the
    promise is several times the measured TTFT, with it within the bound above."""
    case = next(c for c in BENCH.CASES if c.trace.count("prefixes="))
    [point] = BENCH.compare(case, (0.5,))
    assert point.hit_rate > 0.75
    resource = BENCH.load_resource(BENCH.DATA / case.spec_file)
    spec = BENCH.described_spec(resource.spec, BENCH.load_trace(case.trace), point.hit_rate)
    deployment = BENCH._deployment(spec)
    shape = BENCH.planned_shape(spec)
    cold = replace(shape, prefix_cache_hit_rate=0.0)
    model = build_replica_model(deployment.setup)
    without = estimate_at_rate(model, cold, point.rate_per_s, float(deployment.max_num_seqs), point.percentile / 100)
    assert float(without.ttft_quantile_s) * 1e3 > 3 * point.sim_ttft_ms
    assert abs(point.ttft_error) <= EVERY_POINT

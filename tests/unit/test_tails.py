"""The TPOT tail under chunked prefill: short requests that share a step with a prompt chunk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvscale.cli.simulate_cmd import load_deployment
from kvscale.perfmodel import RequestShape, build_replica_model, estimate_at_rate
from kvscale.perfmodel.tails import chunk_share_quantile
from kvscale.sim import FleetConfig, generate_synthetic_trace, simulate
from kvscale.sim.policies import StaticPolicy

ROOT = Path(__file__).resolve().parents[2]
FRACTIONS = np.linspace(0.0, 1.0, 41)


def test_share_quantile_is_bounded_monotone_and_centred() -> None:
    p99 = chunk_share_quantile(FRACTIONS, 211.0, 0.99)
    assert p99[0] == 0.0 and p99[-1] == 1.0
    assert np.all(np.diff(p99) >= 0) and np.all(p99 >= FRACTIONS - 1e-9)
    # The median request of long outputs sees about the mean share of chunk steps ...
    assert chunk_share_quantile(np.array([0.2]), 2000.0, 0.5)[0] == pytest.approx(0.2, abs=0.02)
    # ... while the tail is set by short requests: shorter outputs, wider tail.
    assert np.all(chunk_share_quantile(FRACTIONS, 28.0, 0.99) >= p99)
    assert chunk_share_quantile(np.array([0.1]), 28.0, 0.99)[0] > 3 * 0.1


@pytest.mark.parametrize("rate", [0.6, 1.2])
def test_model_tpot_tail_follows_the_simulated_server(rate: float) -> None:
    """One simulated server (continuous batching, chunked prefill, exponential lengths) against the
    model at the same efficiency: the mean within 3%, the p99 within 25% (prompt lengths also vary
    in the simulator, which the model's mean prompt does not see)."""
    deployment = load_deployment(ROOT / "benchmarks" / "data" / "autoscaling-conv.yaml")
    trace = generate_synthetic_trace(
        f"synthetic:poisson:rate={rate}:duration=3000:input=1024:output=200:lengths=exponential:seed=1")
    m = simulate(deployment, trace, StaticPolicy(1), FleetConfig(tail_s=600.0)).metrics
    model = build_replica_model(deployment.server_setup)
    shape = RequestShape(float(trace.input_tokens.mean()), float(trace.output_tokens.mean()))
    at = estimate_at_rate(model, shape, rate, deployment.max_num_seqs, 0.99)
    assert float(at.tpot_mean_s) * 1000 == pytest.approx(m["p50_tpot_ms"], rel=0.03)
    assert float(at.tpot_quantile_s) * 1000 == pytest.approx(m["p99_tpot_ms"], rel=0.25)
    assert float(at.tpot_quantile_s) > float(at.tpot_mean_s) * 1.1

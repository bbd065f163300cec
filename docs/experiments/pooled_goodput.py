"""Goodput per replica of N replicas whose prefill queues act as one (docs/benchmarks.md, 2026-11-27): needs
docs/experiments/2026-11-27-pooled-prefill-queue.diff applied (estimate_goodput's `replicas`).

Run from the repository root, with the patch applied:
    .venv/bin/python docs/experiments/pooled_goodput.py
Prints, for the benchmark's conversation and code resources, with the planner's factors and with the simulated
servers' (TRUE_SERVER_EFFICIENCY), the goodput per replica at N = 1, 2, 3, 4, 6, 8 and its gain over N = 1.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import autoscaling
from kvscale.cli.simulate_cmd import load_deployment
from kvscale.perfmodel import build_replica_model, estimate_goodput
from kvscale.planner.search import planned_shape, sequences_the_cache_holds

FLEETS = np.array([1, 2, 3, 4, 6, 8], dtype=np.float64)


def main() -> None:
    for resource in ("autoscaling-conv.yaml", "autoscaling-code.yaml"):
        deployment = load_deployment(autoscaling.DATA / resource)
        spec = deployment.spec
        shape = planned_shape(spec)
        slots = float(min(deployment.chosen.max_num_seqs,
                          sequences_the_cache_holds(shape, deployment.server_kv_cache_tokens)))
        for label, setup in (("planner's factors", deployment.setup), ("servers' factors", deployment.server_setup)):
            goodput = estimate_goodput(build_replica_model(setup), shape, np.full(FLEETS.size, slots),
                                       spec.slo.ttft_ms / 1e3, spec.slo.tpot_ms / 1e3, spec.slo.percentile / 100.0,
                                       replicas=FLEETS)  # type: ignore[call-arg]
            single = goodput.request_rate[0]
            cells = [f"N={int(n)} {rate:.3f} ({rate / single - 1:+.0%}, {binding})"
                     for n, rate, binding in zip(FLEETS, goodput.request_rate, goodput.binding, strict=True)]
            print(f"{resource}, {label}: " + "; ".join(cells))


if __name__ == "__main__":
    main()

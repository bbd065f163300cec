"""The model's p99 TPOT against one server's under sustained Poisson load, by load (docs/benchmarks.md, 2026-12-02).

Run from the repository root:
    .venv/bin/python docs/experiments/tpot_tail_by_load_sustained.py [--decode 0.735 --prefill 0.944]
For the conversation and code resources of benchmarks/autoscaling.py, the packaged trace's requests (all of them,
and each 20-minute slice) are resampled into 3,000 Poisson arrivals at 40-85% of the model's saturation rate
and served by one simulated server, as static-peak's load test does (kvscale.sim.loadtest), in the model's own
form and in the benchmark's measured-like form (kvscale.sim.server). The model is given the servers' true speed
(SimulatedDeployment.server_setup) and the slice's mean lengths, so what differs is the model's form alone (its
queueing and tail approximations; the model-form server) and that plus the servers' (measured-like). Prints the
ratio of the servers' p99 TPOT to the model's, and the measured-like servers' to the model at calibrated speed
factors (`--decode`, `--prefill`: the planner's efficiency scaled as kvscale.autoscaler.calibration does; the
defaults are what kvscale had learned on conv x1, seed 1, at 1,000 s). Calibration learns one tail factor at
whatever loads its windows saw; where a ratio climbs with load, the goodput the policy sizes for (at the
highest load) is optimistic.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import numpy as np

sys.path.insert(0, "benchmarks")

LOAD_SHARES = (0.4, 0.55, 0.7, 0.85)
SLICE_S = 1200.0
REQUESTS = 3000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decode", type=float, default=0.735)
    parser.add_argument("--prefill", type=float, default=0.944)
    args = parser.parse_args()
    import autoscaling as bench
    from kvscale.cli.simulate_cmd import load_deployment, load_trace
    from kvscale.perfmodel import build_replica_model, estimate_at_rate
    from kvscale.perfmodel.serving import max_request_rate
    from kvscale.planner.search import planned_shape, sequences_the_cache_holds
    from kvscale.sim.fleet import FleetConfig, simulate
    from kvscale.sim.loadtest import _poisson_trace
    from kvscale.sim.policies import StaticPolicy
    from kvscale.sim.server import MEASURED_LIKE_FORM, MODEL_FORM
    from kvscale.sim.trace import Trace

    forms = {"model-form": MODEL_FORM, "measured-like": replace(MEASURED_LIKE_FORM, seed=1)}
    print("servers' p99 TPOT over the model's (model at the servers' true speed), one server, sustained Poisson "
          f"load of {REQUESTS} requests (command: .venv/bin/python docs/experiments/tpot_tail_by_load_sustained.py)")
    print("| resource | requests | mean in / out | load | rate (req/s) | model p99 TPOT (ms) | "
          + " | ".join(f"{name} ratio" for name in forms) + f" | measured-like over calibrated model "
          f"(decode {args.decode:g}, prefill {args.prefill:g}) |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(forms))
    for resource, trace_name in (("autoscaling-conv.yaml", "azure-conv"), ("autoscaling-code.yaml", "azure-code")):
        deployment = load_deployment(bench.DATA / resource)
        trace = load_trace(trace_name)
        model = build_replica_model(deployment.server_setup)
        calibrated = build_replica_model(replace(deployment.setup, efficiency=deployment.setup.efficiency.scaled(
            decode=args.decode, prefill=args.prefill)))
        quantile = deployment.spec.slo.percentile / 100.0
        slices = [(0.0, trace.duration_s)] + [(lo, lo + SLICE_S) for lo in np.arange(0.0, trace.duration_s, SLICE_S)]
        for lo, hi in slices:
            kept = (trace.arrival_s >= lo) & (trace.arrival_s < hi)
            source = Trace(name=f"{trace_name} [{lo:.0f}, {hi:.0f}) s", arrival_s=trace.arrival_s[kept],
                           input_tokens=trace.input_tokens[kept], output_tokens=trace.output_tokens[kept],
                           duration_s=hi - lo)
            mean_in, mean_out = float(source.input_tokens.mean()), float(source.output_tokens.mean())
            shape = replace(planned_shape(deployment.spec).rescaled(mean_in, mean_out),
                            input_tokens_tail=float(np.percentile(source.input_tokens, 100 * quantile)))
            slots = float(min(deployment.max_num_seqs,
                              sequences_the_cache_holds(shape, deployment.chosen.kv_cache_tokens)))
            saturation = float(max_request_rate(model, shape, [slots])[0])
            for share in LOAD_SHARES:
                rate = share * saturation
                modelled_ms = 1000.0 * float(estimate_at_rate(model, shape, np.array([rate]), slots, quantile)
                                             .tpot_quantile_s[0])
                load = _poisson_trace(source, rate, REQUESTS, 0)
                served_ms = {}  # p99 TPOT of one server of each form under the same arrivals
                for name, form in forms.items():
                    served = simulate(deployment, load, StaticPolicy(1), FleetConfig(tail_s=600.0, server_form=form))
                    served_ms[name] = served.metrics["slo_percentile_tpot_ms"]
                calibrated_ms = 1000.0 * float(estimate_at_rate(calibrated, shape, np.array([rate]), slots, quantile)
                                               .tpot_quantile_s[0])
                ratios = [served / modelled_ms for served in served_ms.values()]
                ratios.append(served_ms["measured-like"] / calibrated_ms)
                print(f"| {resource.removesuffix('.yaml')} | [{lo:.0f}, {hi:.0f}) s | {mean_in:.0f} / {mean_out:.0f} | "
                      f"{share:.2f} | {rate:.2f} | {modelled_ms:.1f} | " + " | ".join(f"{r:.3f}" for r in ratios)
                      + " |", flush=True)


if __name__ == "__main__":
    main()

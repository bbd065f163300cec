"""An example's chosen plan against one simulated replica of it (docs/accuracy.md, 2026-11-29).

Run from the repository root:
    .venv/bin/python docs/experiments/example_plan_vs_sim.py examples/llama-3.1-70b-h100.yaml 0.05,0.5,0.9,1.0
    (and the same with --described)
The planner picks the configuration from the resource as written (means only); one simulated server of it, at
the planner's own efficiency, takes Poisson arrivals at the given fractions of the planned goodput, with
exponential prompt and output lengths of the resource's means (two seeded runs of 4,000 requests, the first 300
of each warm-up). Prints the SLO-percentile TTFT and TPOT, simulated and promised, and the model's parts.
`--described` states the simulated lengths' percentiles in the spec (as benchmarks/model_vs_sim.py does), so
the planner needs to assume no length family.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "benchmarks")


def main() -> None:
    import model_vs_sim as mvs
    from kvscale.api.spec import load_resource
    from kvscale.perfmodel import build_replica_model, estimate_at_rate
    from kvscale.perfmodel.serving import concurrency_limit
    from kvscale.planner.search import planned_shape
    from kvscale.sim.benchserve import run_open_loop

    spec = load_resource(Path(sys.argv[1])).spec
    loads = [float(x) for x in sys.argv[2].split(",")]
    workload = spec.workload
    trace = mvs.load_trace(f"synthetic:poisson:rate=4:duration=3600:input={workload.input_tokens}:"
                           f"output={workload.output_tokens}:lengths=exponential:seed=3")
    if "--described" in sys.argv:
        spec = mvs.described_spec(spec, trace, 0.0)
    deployment = mvs._deployment(spec)
    shape = planned_shape(spec)
    model = build_replica_model(deployment.setup)
    slots = float(concurrency_limit(shape, deployment.max_num_seqs, deployment.chosen.kv_cache_tokens))
    percentile = spec.slo.percentile
    print(f"plan: TP{deployment.setup.tensor_parallel}, max-num-seqs {deployment.max_num_seqs}, "
          f"goodput {deployment.chosen.goodput_requests_per_s:.2f} req/s per replica")
    for load in loads:
        rate = load * deployment.chosen.goodput_requests_per_s
        runs = [run_open_loop(deployment, trace, rate, 4000, seed=seed, warmup=300) for seed in range(2)]
        ttft_s = np.concatenate([run.ttft_s for run in runs])
        tpot_s = np.concatenate([run.tpot_s for run in runs])
        promise = estimate_at_rate(model, shape, rate, slots, percentile / 100.0)
        ttft_ms = np.percentile(ttft_s, percentile) * 1e3
        print(f"load {load:g} ({rate:.2f} req/s): TTFT p{percentile:g} {ttft_ms:.0f} ms "
              f"simulated, {float(promise.ttft_quantile_s) * 1e3:.0f} promised (means {ttft_s.mean() * 1e3:.0f} and "
              f"{float(promise.ttft_mean_s) * 1e3:.0f}; the model's prompt-queue wait "
              f"{float(promise.prefill_wait_mean_s) * 1e3:.0f}) | TPOT p{percentile:g} "
              f"{np.percentile(tpot_s, percentile) * 1e3:.1f} ms simulated, {float(promise.tpot_quantile_s) * 1e3:.1f} "
              f"promised")


if __name__ == "__main__":
    main()

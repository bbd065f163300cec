"""The first wave of a closed-loop run: kvscale.perfmodel.serving.first_wave_ttft_mean_s against the step-level
simulator (kvscale.sim.benchserve.run_closed_loop, warmup=0), docs/accuracy.md, 2026-11-27.

Run from the repository root:
    .venv/bin/python docs/experiments/first_wave_vs_sim.py
Both use the model's step costs: this checks the queue's arithmetic (chunks, decodes taking budget), not them.
"""

from pathlib import Path

import numpy as np

from kvscale.api.spec import load_resource
from kvscale.perfmodel import RequestShape, build_replica_model
from kvscale.perfmodel.serving import first_wave_ttft_mean_s
from kvscale.planner import build_plan_inputs
from kvscale.sim.benchserve import run_closed_loop
from kvscale.sim.deployment import build_simulated_deployment
from kvscale.sim.trace import Trace

OUTPUT_TOKENS = 256


def main() -> None:
    spec = load_resource(Path("examples/llama-3.1-70b-h100.yaml")).spec
    for prompt in (1024, 4096, 8192):
        for clients in (4, 16, 64):
            pinned = spec.model_copy(update={
                "slo": spec.slo.model_copy(update={"ttft_ms": 60_000.0}),
                "workload": spec.workload.model_copy(update={"input_tokens": prompt, "output_tokens": OUTPUT_TOKENS,
                                                            "requests_per_second": 1.0}),
                "serving": spec.serving.model_copy(update={"tensor_parallel": 4, "max_num_seqs": 64})})
            inputs = build_plan_inputs(pinned)
            deployment = build_simulated_deployment(inputs, server_efficiency=inputs.efficiency)
            requests = 2 * clients
            trace = Trace("fixed", np.zeros(requests), np.full(requests, prompt, dtype=np.int64),
                          np.full(requests, OUTPUT_TOKENS, dtype=np.int64), 1.0)
            simulated = float(np.mean(run_closed_loop(deployment, trace, clients, requests, warmup=0).ttft_s[:clients]))
            modelled = first_wave_ttft_mean_s(build_replica_model(deployment.setup),
                                              RequestShape(float(prompt), float(OUTPUT_TOKENS)), clients)
            error_pct = (modelled / simulated - 1) * 100
            print(f"70B BF16 TP4 H100, {prompt} prompt tokens, {clients} clients at once: simulator "
                  f"{simulated * 1e3:,.0f} ms, model {modelled * 1e3:,.0f} ms ({error_pct:+.1f}%)")


if __name__ == "__main__":
    main()

"""The planner's per-GPU capacity at an SLO against a measured-kernel planner's (issue 13, part 5).

    .venv/bin/python benchmarks/capacity.py        # a few seconds

Setting: prompts of 1024 and outputs of 256 tokens (fixed lengths), TTFT 1 s, TPOT 50 ms, bf16. NVIDIA
AIConfigurator 0.12.0 (`aiconfigurator cli default --backend vllm --serving-mode agg`, vLLM 0.24 kernel
tables) reports the output tokens/s per GPU below for its best aggregated configuration (run 2026-11-27;
its tables are measured kernels summed, sizing to mean latencies of a closed loop). kvscale's figure is the
goodput per GPU of its best configuration at the tensor-parallel degree AIConfigurator chose, at the SLO
percentile 95 (kvscale's default, Poisson arrivals) and 50 (closer to the other planner's rule).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from kvscale.api.spec import LLMDeploymentSpec
from kvscale.planner import build_plan_inputs, plan_deployment


@dataclass(frozen=True)
class CapacityCase:
    model: str
    gpu: str
    tensor_parallel: int
    reference_tokens_per_s_per_gpu: float  # AIConfigurator 0.12.0, vLLM backend, aggregated serving


CASES = (
    CapacityCase("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM", 1, 6260.7),
    CapacityCase("meta-llama/Llama-3.1-70B-Instruct", "H100-SXM", 4, 573.9),
    CapacityCase("Qwen/Qwen3-32B", "H200", 2, 1504.4),
)
PERCENTILES = (95.0, 50.0)


def case_spec(case: CapacityCase, percentile: float) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({
        "model": {"name": case.model, "precision": "bf16"},
        "gpu": {"types": [case.gpu]},
        "slo": {"ttftMs": 1000, "tpotMs": 50, "percentile": percentile},
        "workload": {"requestsPerSecond": 1, "inputTokens": 1024, "outputTokens": 256,
                     "inputTokensPercentiles": {"p1": 1024, "p99": 1024},
                     "outputTokensPercentiles": {"p1": 256, "p99": 256}},
        "serving": {"tensorParallel": case.tensor_parallel},
        "scaling": {"minReplicas": 1, "maxReplicas": 100},
    })


def tokens_per_s_per_gpu(case: CapacityCase, percentile: float) -> float:
    """The best goodput per GPU over the planner's feasible candidates (any max-num-seqs) at the case's TP."""
    plan = plan_deployment(build_plan_inputs(case_spec(case, percentile)))
    feasible = [c for c in plan.alternatives if c.feasible]
    return max((c.goodput_output_tokens_per_s / c.gpus_per_replica for c in feasible), default=0.0)


def main() -> int:
    print("capacity at the SLO (command: .venv/bin/python benchmarks/capacity.py): ISL 1024 / OSL 256, TTFT 1 s, "
          "TPOT 50 ms, bf16; output tokens/s per GPU against AIConfigurator 0.12.0 (vLLM backend)")
    for case in CASES:
        figures = []
        for percentile in PERCENTILES:
            ours = tokens_per_s_per_gpu(case, percentile)
            gap = ours / case.reference_tokens_per_s_per_gpu - 1.0
            figures.append(f"p{percentile:.0f} {ours:8.1f} ({gap:+.1%})")
        print(f"  {case.model.split('/')[-1]:<24} {case.gpu:<9} TP{case.tensor_parallel}: AIConfigurator "
              f"{case.reference_tokens_per_s_per_gpu:8.1f}; kvscale " + ", ".join(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The simulated deployment: what the planner chose for a spec, and how its servers really behave.

The policy sees the plan (the planner's default efficiency); the simulated servers run with their
own "true" efficiency, deliberately different, so that the operator's online calibration has
something to learn, as it does against real hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvscale.api.spec import LLMDeploymentSpec
from kvscale.errors import InvalidSpecError
from kvscale.perfmodel import DEFAULT_EFFICIENCY, EfficiencyFactors, ServingSetup
from kvscale.perfmodel.replica import compute_replica_kv_capacity
from kvscale.planner import Candidate, Plan, chosen_setup, plan_deployment
from kvscale.planner.search import PlanInputs

# The simulated servers: 20% slower at memory-bound (decode) work, 15% slower at compute-bound
# (prefill) work and twice the fixed per-step cost of the planner's defaults.
TRUE_SERVER_EFFICIENCY = replace(DEFAULT_EFFICIENCY.scaled(decode=0.8, prefill=0.85), step_overhead_s=3.0e-3)


@dataclass(frozen=True)
class SimulatedDeployment:
    """One LLMDeployment as planned, and the servers that will run it."""

    spec: LLMDeploymentSpec
    plan: Plan
    chosen: Candidate
    setup: ServingSetup  # as planned: what the policy's context carries
    server_setup: ServingSetup  # as simulated: the same configuration with the true efficiency
    server_kv_cache_tokens: int
    usd_per_gpu_hour: float

    @property
    def tensor_parallel(self) -> int:
        return self.setup.tensor_parallel

    @property
    def gpus_per_replica(self) -> int:
        """TP x PP x DP: a replica over several nodes holds all their GPUs."""
        return self.setup.gpus

    @property
    def max_num_seqs(self) -> int:
        """Sequences a replica runs at once (every data-parallel engine's max-num-seqs)."""
        return self.setup.replica_max_num_seqs(self.chosen.max_num_seqs)

    @property
    def max_model_len(self) -> int:
        return self.chosen.max_model_len

    @property
    def label(self) -> str:
        return (f"{self.plan.model} on {self.gpus_per_replica} x {self.setup.gpu.name} ({self.chosen.parallelism}, "
                f"max-num-seqs {self.chosen.max_num_seqs}, max-model-len {self.max_model_len})")


def build_simulated_deployment(inputs: PlanInputs,
                               server_efficiency: EfficiencyFactors = TRUE_SERVER_EFFICIENCY) -> SimulatedDeployment:
    """Plan the spec and describe the servers: the plan's configuration with `server_efficiency`."""
    plan = plan_deployment(inputs)
    chosen = plan.chosen
    if chosen is None:
        raise InvalidSpecError(f"nothing to simulate: the plan is infeasible: {plan.explanation}")
    gpu = next(g for g in inputs.gpus if g.name == chosen.gpu_type)
    spec = inputs.spec
    setup = replace(chosen_setup(inputs, chosen), gpu_memory_utilization=chosen.gpu_memory_utilization)
    server_setup = replace(setup, efficiency=server_efficiency)
    kv_tokens = compute_replica_kv_capacity(server_setup, chosen.max_num_seqs).tokens
    return SimulatedDeployment(spec=spec, plan=plan, chosen=chosen, setup=setup, server_setup=server_setup,
                               server_kv_cache_tokens=int(kv_tokens), usd_per_gpu_hour=gpu.usd_per_hour)

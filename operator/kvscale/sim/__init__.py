"""The fleet simulator: continuous-batching servers on the performance model, scaled by kvscale's own
policy (`kvscale.autoscaler.decide`, unchanged) or by the baselines people run today. Pure: traces
come in as bytes or arrays, time is simulated, nothing reads a clock, the environment or the network.
"""

from kvscale.sim.deployment import TRUE_SERVER_EFFICIENCY, SimulatedDeployment, build_simulated_deployment
from kvscale.sim.fleet import FleetConfig, simulate
from kvscale.sim.loadtest import build_policy, load_test_capacity
from kvscale.sim.policies import POLICIES, ScalingPolicy
from kvscale.sim.result import SimulationResult, TimelinePoint
from kvscale.sim.synthetic import generate_synthetic_trace
from kvscale.sim.trace import AZURE_ATTRIBUTION, PACKAGED_TRACES, Trace, parse_trace_csv

__all__ = [
    "AZURE_ATTRIBUTION",
    "PACKAGED_TRACES",
    "POLICIES",
    "TRUE_SERVER_EFFICIENCY",
    "FleetConfig",
    "ScalingPolicy",
    "SimulatedDeployment",
    "SimulationResult",
    "TimelinePoint",
    "Trace",
    "build_policy",
    "build_simulated_deployment",
    "generate_synthetic_trace",
    "load_test_capacity",
    "parse_trace_csv",
    "simulate",
]

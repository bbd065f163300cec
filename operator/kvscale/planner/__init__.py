"""The planner: search GPU type x tensor parallel x max-num-seqs for the cheapest SLO-compliant plan."""

from kvscale.planner.plan import Candidate, CandidateCurve, Plan, Predicted
from kvscale.planner.search import (
    PlanInputs,
    build_plan_inputs,
    build_serving_setup,
    chosen_setup,
    plan_deployment,
)

__all__ = [
    "Candidate",
    "CandidateCurve",
    "Plan",
    "PlanInputs",
    "Predicted",
    "build_plan_inputs",
    "build_serving_setup",
    "chosen_setup",
    "plan_deployment",
]

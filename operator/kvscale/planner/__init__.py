"""The planner: search GPU type x tensor parallel x max-num-seqs for the cheapest SLO-compliant plan."""

from kvscale.planner.plan import Candidate, CandidateCurve, Plan, Predicted
from kvscale.planner.search import build_plan_inputs, plan_deployment

__all__ = ["Candidate", "CandidateCurve", "Plan", "Predicted", "build_plan_inputs", "plan_deployment"]

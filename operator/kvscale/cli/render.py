"""Human-readable plan tables."""

from __future__ import annotations

import textwrap

from kvscale.planner import Plan


def render_plan(name: str, plan: Plan) -> str:
    lines = [f"{name}: {plan.model}, {plan.workload_requests_per_second:g} req/s, "
             f"SLO p{plan.percentile:g} TTFT {plan.ttft_slo_ms:g} ms / TPOT {plan.tpot_slo_ms:g} ms"]
    header = f"{'':2}{'GPU':<14}{'TP':>3}{'PP':>3}{'DP':>3}{'seqs':>6}{'repl':>5}{'GPUs':>5}{'$/h':>9}{'tok/$':>12}" \
             f"{'req/s/repl':>11}{'TTFT ms':>9}{'TPOT ms':>9}  binding"
    if plan.alternatives:
        lines += ["", header]
        for c in plan.alternatives[:12]:
            mark = "* " if plan.chosen is c else "  "
            p = c.predicted
            lines.append(
                f"{mark}{c.gpu_type:<14}{c.tensor_parallel:>3}{c.pipeline_parallel:>3}{c.data_parallel:>3}{c.max_num_seqs:>6}{c.replicas:>5}{c.gpus:>5}"
                f"{c.cost_per_hour:>9.2f}{c.tokens_per_dollar:>12,.0f}{c.goodput_requests_per_s:>11.2f}"
                f"{(p.ttft_ms if p else 0):>9.0f}{(p.tpot_ms if p else 0):>9.1f}  {c.binding}")
    if plan.rejected:
        lines += ["", "rejected:"]
        lines += [f"  {c.gpu_type} {c.parallelism}: {c.rejection}" for c in plan.rejected[:12]]
    verdict = "PLAN" if plan.feasible else "INFEASIBLE"
    lines += ["", f"{verdict} (binding: {plan.binding_constraint})"]
    lines += textwrap.wrap(plan.explanation, width=100, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)

"""Re-planning benchmark (tracker issue 17): what the recommendation would have saved on traffic that drifted.

    .venv/bin/python benchmarks/replan.py [--json OUT.json]

Each case is a resource planned for the workload its spec states and a synthetic day-shaped trace of the
traffic it was really served (another request shape, another rate). The simulated fleet (kvscale's own
policy, servers that differ from the planner's model in form: kvscale.sim.server.MEASURED_LIKE_FORM,
start-ups drawn from 60-300 s) serves the first LEARN_S of the trace on the planned configuration; then the
operator's re-plan runs on what that policy calibrated (request shape, speed and tail factors) and the
per-minute rates its forecaster kept, exactly as `kvscale.controllers.replanning` does in the cluster. The
rest of the trace is then served twice, each with kvscale's autoscaling: without re-planning (the planned
configuration) and with it (the proposed configuration, where it is recommended: at least
replanMinSavings cheaper; the move itself, which `Auto` would make as a second Deployment, is not
simulated: the rest starts on the new configuration). Printed per case: the recommendation, and cost,
GPU-hours and SLO attainment over the rest, both ways.

Nothing here is tuned: the threshold is the spec's default (15%), and the cases were written before the
first run. A control case is served what its spec states: nothing may be recommended there.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvscale.api.spec import LLMDeploymentSpec
from kvscale.autoscaler import Calibration
from kvscale.cli.simulate_cmd import load_trace
from kvscale.controllers.replanning import served_traffic
from kvscale.planner import PlanInputs, build_plan_inputs
from kvscale.planner.replan import replan
from kvscale.sim import FleetConfig, SimulatedDeployment, simulate
from kvscale.sim.deployment import build_simulated_deployment
from kvscale.sim.policies import KvscalePolicy
from kvscale.sim.server import MEASURED_LIKE_FORM

ROOT = Path(__file__).resolve().parents[1]
LEARN_S = 3600.0  # the traffic the re-plan sees: one hour
STARTUP_RANGE_S = (60.0, 300.0)
CONFIG = FleetConfig(startup_s=STARTUP_RANGE_S[0], startup_range_s=STARTUP_RANGE_S, seed=1,
                     server_form=replace(MEASURED_LIKE_FORM, seed=1))


def _spec(gpu_types: list[str], rps: float, input_tokens: int, output_tokens: int, ttft_ms: float,
          tpot_ms: float) -> dict[str, Any]:
    return {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "precision": "bf16"},
            "gpu": {"types": gpu_types, "perNode": 8},
            "slo": {"ttftMs": ttft_ms, "tpotMs": tpot_ms, "percentile": 99},
            "workload": {"requestsPerSecond": rps, "inputTokens": input_tokens, "outputTokens": output_tokens,
                         "maxContextTokens": 16384},
            "scaling": {"minReplicas": 1, "maxReplicas": 24, "headroom": 0.1}}


def _diurnal(rate: float, input_tokens: int, output_tokens: int, seed: int) -> str:
    return (f"synthetic:diurnal:rate={rate:g}:amplitude=0.6:period=14400:duration=14400:input={input_tokens}:"
            f"output={output_tokens}:lengths=exponential:seed={seed}")


@dataclass(frozen=True)
class Case:
    name: str
    spec: dict[str, Any]
    trace: str


CASES = (
    # Declared as chat (1,024/256) at 4 req/s on L4 or H100; served RAG-like long prompts, short answers.
    Case("long prompts, short outputs", _spec(["L4", "H100-SXM"], 4, 1024, 256, 2000, 80),
         _diurnal(2.0, 6000, 150, 0)),
    # Declared at a high rate (the planner packs big replicas); served a fifth of it, same shape.
    Case("a fifth of the declared rate", _spec(["L4", "H100-SXM"], 20, 1024, 256, 2000, 80),
         _diurnal(4.0, 1024, 256, 1)),
    # Declared for long prompts; served short chat turns.
    Case("short prompts, long outputs", _spec(["L4", "H100-SXM"], 3, 6000, 150, 2000, 80),
         _diurnal(3.0, 600, 400, 2)),
    # Control: served what the spec states.
    Case("control: as declared", _spec(["L4", "H100-SXM"], 4, 1024, 256, 2000, 80), _diurnal(4.0, 1024, 256, 3)),
)


def _pinned(inputs: PlanInputs, gpu_type: str, tp: int, pp: int, max_num_seqs: int) -> SimulatedDeployment:
    """The deployment as it would run after the move: the proposed configuration, pinned in the spec."""
    spec = inputs.spec
    pinned = spec.model_copy(update={
        "gpu": spec.gpu.model_copy(update={"types": [gpu_type]}),
        "serving": spec.serving.model_copy(update={"tensor_parallel": tp, "pipeline_parallel": pp,
                                                   "max_num_seqs": max_num_seqs})})
    return build_simulated_deployment(build_plan_inputs(pinned))


HALF_HOUR_S = 1800.0


def _factors(c: Calibration) -> dict[str, float]:
    return {"decode_factor": round(c.decode_factor, 3), "prefill_factor": round(c.prefill_factor, 3),
            "ttft_tail_factor": round(c.ttft_tail_factor, 3), "tpot_tail_factor": round(c.tpot_tail_factor, 3)}


def _served(deployment: SimulatedDeployment, rest: Any, initial: int) -> dict[str, Any]:
    policy = KvscalePolicy(deployment, initial=initial)
    result = simulate(deployment, rest, policy, CONFIG)
    metrics = result.metrics
    # Per half hour of the rest: arrivals/s and replicas paid for (what the pricing is checked against).
    halves: dict[int, list[tuple[float, int]]] = {}
    for point in result.timeline:
        halves.setdefault(int(point.t_s // HALF_HOUR_S), []).append((point.arrival_rate, point.paid_replicas))
    return {"config": deployment.label, "cost_usd": metrics["cost"], "gpu_hours": metrics["gpu_hours"],
            "slo_attainment": metrics["slo_attainment"],
            "calibration": _factors(policy.calibration),
            "by_half_hour": [{"from_min": 30 * k, "arrivals_per_s": round(sum(a for a, _ in v) / len(v), 2),
                              "paid_replicas": round(sum(r for _, r in v) / len(v), 2)}
                             for k, v in sorted(halves.items())]}


def run_case(case: Case) -> dict[str, Any]:
    inputs = build_plan_inputs(LLMDeploymentSpec.model_validate(case.spec))
    planned = build_simulated_deployment(inputs)
    trace = load_trace(case.trace)
    learner = KvscalePolicy(planned)
    # No drain after the cut: the operator re-plans on live traffic, not on a fleet finishing its last
    # (longest) requests with no arrivals, which would read as long outputs and an idle minute.
    simulate(planned, trace.truncated(LEARN_S), learner, replace(CONFIG, tail_s=0.0))
    traffic = served_traffic(inputs, learner.calibration, learner.history.forecasts.day)
    result = replan(inputs, planned.chosen, traffic)
    threshold = inputs.spec.scaling.replan_min_savings
    recommended = result.moves and (result.current is None or result.savings >= threshold)
    rest = trace.after(LEARN_S)
    # Without: the fleet carries on with the replicas it had at the cut. With: the new configuration starts
    # with what the demand of the last minute needs of it (a move sizes the new Deployment for the load,
    # not for the spec's stated rate).
    running = learner.last.desired_replicas if learner.last is not None else planned.chosen.replicas
    without = _served(planned, rest, running)
    if recommended and result.best is not None:
        c = result.best.candidate
        last_minute = traffic.minute_rates_per_s[-1] if traffic.minute_rates_per_s else 0.0
        needed = math.ceil(last_minute * (1 + inputs.spec.scaling.headroom) / c.goodput_requests_per_s - 1e-9)
        initial = min(max(needed, inputs.spec.scaling.min_replicas), inputs.spec.scaling.max_replicas)
        with_replan = _served(_pinned(inputs, c.gpu_type, c.tensor_parallel, c.pipeline_parallel, c.max_num_seqs),
                              rest, initial)
    else:
        with_replan = without
    learned = _factors(learner.calibration)
    best = result.best
    priced = None if best is None else {"goodput_requests_per_s": round(best.candidate.goodput_requests_per_s, 3),
                                        "mean_replicas": round(best.mean_replicas, 3)}
    return {"case": case.name, "trace": case.trace, "planned": planned.label, "recommended": recommended,
            "learned_calibration": learned, "proposed_as_priced": priced,
            "savings_pct_predicted": round(100 * result.savings, 1), "reason": result.reason,
            "without": without, "with": with_replan}


def _line(label: str, served: dict[str, Any]) -> str:
    attainment = served["slo_attainment"]
    return (f"    {label:<8} {served['config']}\n"
            f"             ${served['cost_usd']:.2f}, {served['gpu_hours']:.2f} GPU-h, "
            f"{100 * attainment:.2f}% within the SLOs" if attainment is not None else "no requests")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--diagnose", action="store_true",
                        help="also print the calibrations and, per half hour of the rest, arrivals and replicas")
    args = parser.parse_args(argv)
    print(f"Re-planning after {LEARN_S / 3600:g} h of served traffic; the rest of each 4-hour day served "
          "with and without the recommendation (kvscale autoscaling both ways).\n"
          "Command: .venv/bin/python benchmarks/replan.py")
    rows = []
    for case in CASES:
        start = time.monotonic()
        row = run_case(case)
        rows.append(row)
        print(f"\n{case.name}  [{case.trace}]  ({time.monotonic() - start:.0f} s)")
        print(f"  planned: {row['planned']}")
        print(f"  re-plan: {'RECOMMENDED' if row['recommended'] else 'nothing recommended'}: {row['reason']}")
        print(_line("without", row["without"]))
        print(_line("with", row["with"]))
        w, o = row["with"], row["without"]
        if args.diagnose:
            print(f"  learned on the first hour: {row['learned_calibration']}; proposed as priced: "
                  f"{row['proposed_as_priced']}")
            for label, served in (("without", o), ("with", w)):
                print(f"  {label}: own calibration {served['calibration']}")
                print("    " + "; ".join(f"{h['from_min']} min {h['arrivals_per_s']} req/s {h['paid_replicas']} repl"
                                         for h in served["by_half_hour"]))
        if row["recommended"] and o["cost_usd"]:
            print(f"  with / without: cost x{w['cost_usd'] / o['cost_usd']:.2f}, attainment "
                  f"{100 * ((w['slo_attainment'] or 0) - (o['slo_attainment'] or 0)):+.2f} points")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Re-planning benchmark (tracker issue 17): what the recommendation would have saved on traffic that drifted.

    .venv/bin/python benchmarks/replan.py [--json OUT.json]

Each case is a resource planned for the workload its spec states and a synthetic trace of two 4-hour
diurnal days of the traffic it was really served (another request shape, another rate). The simulated
fleet (kvscale's own policy, servers that differ from the planner's model in form:
kvscale.sim.server.MEASURED_LIKE_FORM, start-ups drawn from 60-300 s) serves the first day of the trace on
the planned configuration; then the
operator's re-plan runs on what that policy calibrated (request shape, speed and tail factors) and the
per-minute rates its forecaster kept, exactly as `kvscale.controllers.replanning` does in the cluster. The
second day is then served twice, each with kvscale's autoscaling: without re-planning (the planned
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvscale.api.conditions import ServingConfiguration
from kvscale.api.spec import LLMDeploymentSpec
from kvscale.autoscaler import Calibration
from kvscale.cli.simulate_cmd import load_trace
from kvscale.controllers.replanning import recommendation_status, served_traffic
from kvscale.planner import PlanInputs, build_plan_inputs
from kvscale.planner.replan import pinned_to, replan
from kvscale.sim import FleetConfig, SimulatedDeployment, Trace, simulate
from kvscale.sim.deployment import build_simulated_deployment
from kvscale.sim.policies import KvscalePolicy
from kvscale.sim.server import MEASURED_LIKE_FORM

ROOT = Path(__file__).resolve().parents[1]
DAY_S = 14400.0  # the synthetic traces' day: 4 hours (a diurnal cycle at a sixth of the wall clock's)
LEARN_S = DAY_S  # the traffic the re-plan sees: one whole day (spec.scaling.replanMinHistorySeconds)
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
            # One re-plan at the cut: the sustain window is not simulated; the history asked for is one day.
            "scaling": {"minReplicas": 1, "maxReplicas": 24, "headroom": 0.1, "replanSustainSeconds": 0,
                        "replanMinHistorySeconds": int(DAY_S)}}


def _diurnal(rate: float, input_tokens: int, output_tokens: int, seed: int, days: int = 2, drift: str = "") -> str:
    return (f"synthetic:diurnal:rate={rate:g}:amplitude=0.6:period={DAY_S:g}:duration={days * DAY_S:g}:"
            f"input={input_tokens}:output={output_tokens}:lengths=exponential:seed={seed}{drift}")


@dataclass(frozen=True)
class Case:
    name: str
    spec: dict[str, Any]
    trace: str
    days: int = 2  # the first is learned on; a re-plan at the end of each day but the last


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
    # Drifting shapes (`kvscale simulate`'s drift keys): prompts growing over three days, as a chat
    # application turns into retrieval; and a shape that swings within each day (long prompts at the peak).
    Case("drift: prompts grow over three days", _spec(["L4", "H100-SXM"], 2, 1024, 256, 2000, 80),
         _diurnal(2.0, 1024, 256, 4, days=3, drift=":input_to=7000:output_to=150:drift=linear"), days=3),
    Case("drift: long prompts at each day's peak", _spec(["L4", "H100-SXM"], 3, 1024, 256, 2000, 80),
         _diurnal(3.0, 600, 300, 5, days=3, drift=":input_to=5000:output_to=150:drift=daily"), days=3),
)


def _pinned(inputs: PlanInputs, configuration: ServingConfiguration) -> SimulatedDeployment:
    """The deployment as it would run after the move: the proposed configuration, pinned in the spec."""
    return build_simulated_deployment(build_plan_inputs(pinned_to(inputs.spec, configuration)))


HALF_HOUR_S = 1800.0
CUT_AT = datetime(2026, 1, 1, tzinfo=UTC)  # when the re-plan runs: only its difference to other times counts


def _factors(c: Calibration) -> dict[str, float]:
    return {"decode_factor": round(c.decode_factor, 3), "prefill_factor": round(c.prefill_factor, 3),
            "ttft_tail_factor": round(c.ttft_tail_factor, 3), "tpot_tail_factor": round(c.tpot_tail_factor, 3)}


def _served(deployment: SimulatedDeployment, rest: Trace, initial: int,
            tail: bool = True) -> tuple[dict[str, Any], KvscalePolicy]:
    """`rest` served on `deployment` under kvscale's autoscaling. `tail`: simulate its last requests to the
    end; without it (a day followed by another) the cut is live, as a re-plan's is (those few unfinished
    requests count as missed)."""
    policy = KvscalePolicy(deployment, initial=initial)
    result = simulate(deployment, rest, policy, CONFIG if tail else replace(CONFIG, tail_s=0.0))
    metrics = result.metrics
    # Per half hour of the rest: arrivals/s and replicas paid for (what the pricing is checked against).
    halves: dict[int, list[tuple[float, int]]] = {}
    for point in result.timeline:
        halves.setdefault(int(point.t_s // HALF_HOUR_S), []).append((point.arrival_rate, point.paid_replicas))
    return {"config": deployment.label, "cost_usd": metrics["cost"], "gpu_hours": metrics["gpu_hours"],
            "slo_attainment": metrics["slo_attainment"], "requests": metrics["requests"],
            "calibration": _factors(policy.calibration),
            "by_half_hour": [{"from_min": 30 * k, "arrivals_per_s": round(sum(a for a, _ in v) / len(v), 2),
                              "paid_replicas": round(sum(r for _, r in v) / len(v), 2)}
                             for k, v in sorted(halves.items())]}, policy


def _joined(days: list[dict[str, Any]]) -> dict[str, Any]:
    """Consecutive days served one by one, as one figure: costs add, attainment weighted by requests."""
    if len(days) == 1:
        return days[0]
    requests = sum(d["requests"] for d in days)
    met = sum((d["slo_attainment"] or 0.0) * d["requests"] for d in days)
    configs = list(dict.fromkeys(d["config"] for d in days))
    return {"config": " then ".join(configs), "cost_usd": round(sum(d["cost_usd"] for d in days), 4),
            "gpu_hours": round(sum(d["gpu_hours"] for d in days), 4),
            "slo_attainment": round(met / requests, 5) if requests else None, "requests": requests,
            "calibration": days[-1]["calibration"], "by_half_hour": [h for d in days for h in d["by_half_hour"]]}


@dataclass(frozen=True)
class _Replanned:
    recommended: bool
    reason: str
    savings: float
    priced: dict[str, Any] | None
    next_deployment: SimulatedDeployment | None  # what the next day runs on, when recommended
    next_initial: int


def _replan_after(inputs: PlanInputs, running: SimulatedDeployment, policy: KvscalePolicy) -> _Replanned:
    """The operator's re-plan on what `policy` calibrated and its forecaster kept; where recommended, the
    configuration to move to and what the demand of the last minute needs of it."""
    traffic = served_traffic(inputs, policy.calibration, policy.history.forecasts.day)
    result = replan(inputs, running.chosen, traffic)
    # The operator's own rule: replanMinSavings, and a day of history (the sustain window is 0 here).
    recommended = recommendation_status(inputs.spec, None, result, traffic, CUT_AT).recommended
    best = result.best
    priced = None if best is None else {"goodput_requests_per_s": round(best.candidate.goodput_requests_per_s, 3),
                                        "mean_replicas": round(best.mean_replicas, 3)}
    if not recommended or best is None:
        return _Replanned(False, result.reason, result.savings, priced, None, 0)
    c = best.candidate
    # A move sizes the new Deployment for the load, not for the spec's stated rate.
    last_minute = traffic.minute_rates_per_s[-1] if traffic.minute_rates_per_s else 0.0
    scaling = inputs.spec.scaling
    needed = math.ceil(last_minute * (1 + scaling.headroom) / c.goodput_requests_per_s - 1e-9)
    return _Replanned(True, result.reason, result.savings, priced,
                      _pinned(inputs, c),
                      min(max(needed, scaling.min_replicas), scaling.max_replicas))


def _initial_after(policy: KvscalePolicy, deployment: SimulatedDeployment) -> int:
    return policy.last.desired_replicas if policy.last is not None else deployment.chosen.replicas


def run_case(case: Case) -> dict[str, Any]:
    inputs = build_plan_inputs(LLMDeploymentSpec.model_validate(case.spec))
    planned = build_simulated_deployment(inputs)
    trace = load_trace(case.trace)
    learner = KvscalePolicy(planned)
    # No drain after the cut: the operator re-plans on live traffic, not on a fleet finishing its last
    # (longest) requests with no arrivals, which would read as long outputs and an idle minute.
    simulate(planned, trace.truncated(DAY_S), learner, replace(CONFIG, tail_s=0.0))
    # Without: the fleet carries on with the replicas it had at the cut, on the planned configuration.
    without, _ = _served(planned, trace.after(DAY_S), _initial_after(learner, planned))
    # With: a re-plan at the end of each day; the next day runs on what it recommended (the move itself,
    # which Auto makes as a second Deployment, is not simulated: the day starts on the new configuration).
    running, policy, days, replans = planned, learner, [], []
    for day in range(1, case.days):
        replanned = _replan_after(inputs, running, policy)
        replans.append(replanned)
        initial = _initial_after(policy, running)
        if replanned.next_deployment is not None:
            running, initial = replanned.next_deployment, replanned.next_initial
        if day == 1 and case.days == 2 and replanned.next_deployment is None:
            days.append(without)  # nothing changes: the day served without is the day served with
            break
        last_day = day == case.days - 1
        segment = trace.after(day * DAY_S)
        served, policy = _served(running, segment if last_day else segment.truncated(DAY_S), initial,
                                 tail=last_day)
        days.append(served)
    first = replans[0]
    return {"case": case.name, "trace": case.trace, "planned": planned.label,
            "recommended": [r.recommended for r in replans],
            "learned_calibration": _factors(learner.calibration), "proposed_as_priced": first.priced,
            "savings_pct_predicted": [round(100 * r.savings, 1) for r in replans],
            "reasons": [r.reason for r in replans], "without": without, "with": _joined(days)}


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
    print(f"Re-planning at the end of each {DAY_S / 3600:g}-hour day of served traffic; the days after the "
          "first served with and without the recommendations (kvscale autoscaling both ways).\n"
          "Command: .venv/bin/python benchmarks/replan.py")
    rows = []
    for case in CASES:
        start = time.monotonic()
        row = run_case(case)
        rows.append(row)
        print(f"\n{case.name}  [{case.trace}]  ({time.monotonic() - start:.0f} s)")
        print(f"  planned: {row['planned']}")
        for day, (recommended, reason) in enumerate(zip(row["recommended"], row["reasons"], strict=True), 1):
            print(f"  re-plan after day {day}: {'RECOMMENDED' if recommended else 'nothing recommended'}: {reason}")
        print(_line("without", row["without"]))
        print(_line("with", row["with"]))
        w, o = row["with"], row["without"]
        if args.diagnose:
            print(f"  learned on the first day: {row['learned_calibration']}; proposed as priced: "
                  f"{row['proposed_as_priced']}")
            for label, served in (("without", o), ("with", w)):
                print(f"  {label}: own calibration {served['calibration']}")
                print("    " + "; ".join(f"{h['from_min']} min {h['arrivals_per_s']} req/s {h['paid_replicas']} repl"
                                         for h in served["by_half_hour"]))
        if any(row["recommended"]) and o["cost_usd"]:
            print(f"  with / without: cost x{w['cost_usd'] / o['cost_usd']:.2f}, attainment "
                  f"{100 * ((w['slo_attainment'] or 0) - (o['slo_attainment'] or 0)):+.2f} points")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Whether an error budget pays: kvscale's policy with its margins (headroom and the scale-down tolerance) scaled
by the share of the SLO's error budget the last hour spent, read from vLLM's TTFT and per-request TPOT
histograms (Observation.missed_slo_share), against the policy as it ships.

Run from the repository root:
    .venv/bin/python docs/experiments/error_budget.py [--gain 1 2] [--seed 1] [--jobs 2] [--only SUBSTRING]

The question it answers: the reactive oracle (docs/experiments/reactive_bound.py) reaches the schedule line on
the smooth cases by sizing each minute for a few percent of misses and still ending above 99%; kvscale sizes
every decision for none (the model's percentile within the SLO, then 10% headroom, then a 10% scale-down
tolerance). A policy that spends the budget it measures keeps its margins while misses use the budget and
lets them go while they do not.

The variant, applied around kvscale.autoscaler.decide without changing it (so the shipped policy is the
baseline, run beside it on the same servers and fleet seed):
- each decision adds its new requests (the window's rate x the decision interval) and their missed share, as
  the histograms read it, to an hour's record; the budget spent is the hour's misses over the share the SLO
  percentile allows (1% at p99); until 10 misses' worth of budget was seen the margins stay whole;
- with s = min(1, spent), the headroom is headroom x (1 - gain x (1 - s)) and the tolerance tolerance x s:
  gain 1 shrinks the headroom to 0 with nothing spent, gain 2 to minus the headroom (sizing past the
  calibrated goodput where an hour showed it conservative). The floors that read the headroom (the stated
  load's, the recurring peaks') see the same.
It also prints, per case and for the baseline run, the misses the histograms estimate against those the
simulator counted (both over the whole run): how far the signal can be trusted.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

sys.path.insert(0, "benchmarks")

BUDGET_WINDOW_S = 3_600.0
BUDGET_MIN_MISSES = 10.0


@dataclass
class BudgetedDecide:
    """kvscale.autoscaler.decide with its margins scaled by the error budget spent (gain None: unchanged, but the
    histograms' estimate of the misses is still recorded)."""

    decide: Any
    gain: float | None
    served: list[tuple[float, float, float]]

    def spent(self, now_s: float, allowed: float) -> float | None:
        seen = [(r, m) for t, r, m in self.served if now_s - t <= BUDGET_WINDOW_S]
        requests = sum(r for r, _ in seen)
        if requests * allowed < BUDGET_MIN_MISSES:
            return None
        return sum(m for _, m in seen) / (requests * allowed)

    def __call__(self, observation: Any, context: Any, history: Any, now_s: float) -> Any:
        from kvscale.units import ms_to_s

        spec = context.spec
        if observation is not None and observation.request_rate is not None:
            missed = observation.missed_slo_share(ms_to_s(spec.slo.ttft_ms), ms_to_s(spec.slo.tpot_ms))
            if missed is not None:
                requests = observation.request_rate * min(observation.window_s, context.decision_interval_s)
                self.served.append((observation.sampled_at_s, requests, requests * missed))
        spent = self.spent(now_s, 1.0 - spec.slo.percentile / 100.0)
        if self.gain is not None and spent is not None:
            share = min(1.0, spent)
            scaling = spec.scaling.model_copy(update={
                "headroom": spec.scaling.headroom * (1.0 - self.gain * (1.0 - share)),
                "scale_down_tolerance": spec.scaling.scale_down_tolerance * share})
            context = replace(context, spec=spec.model_copy(update={"scaling": scaling}))
        return self.decide(observation, context, history, now_s)


def run_one(index: int, seed: int, gain: float | None) -> tuple[dict[str, Any], float]:
    """(the run's metrics, the share of its requests the histograms estimate missed)."""
    import autoscaling as bench
    import kvscale.sim.policies as policies
    from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation

    bench._use_seed(seed)
    case = bench.CASES[index]
    original = policies.decide
    budgeted = BudgetedDecide(original, gain, [])
    policies.decide = budgeted
    try:
        result = run_simulation(load_deployment(bench.DATA / case.resource), load_trace(case.trace), "kvscale",
                                speedup=case.speedup, config=bench.CONFIG)
    finally:
        policies.decide = original
    requests = sum(r for _, r, _ in budgeted.served)
    return result.metrics, (sum(m for _, _, m in budgeted.served) / requests if requests else float("nan"))


def main() -> None:
    import autoscaling as bench

    parser = bench.experiment_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--gain", type=float, nargs="+", default=[1.0, 2.0])
    args = parser.parse_args()
    chosen = bench.referenced_cases(args.only)
    gains: list[float | None] = [None, *args.gain]
    jobs = [(i, g) for i in chosen for g in gains]
    print(f"kvscale with its margins scaled by the error budget spent, fleet seed {args.seed} (command: "
          f".venv/bin/python docs/experiments/error_budget.py --gain {' '.join(f'{g:g}' for g in args.gain)} "
          f"--seed {args.seed})")
    print("each cell: SLO attainment and GPU-hours over the trace's span; misses: the histograms' estimate (sum of "
          "the TTFT and TPOT shares) and the simulator's count, over the baseline's whole run")
    print("| set | case | kvscale as shipped | " + " | ".join(f"budget, gain {g:g}" for g in args.gain)
          + " | misses: estimated / counted |")
    print("|---|---|---|" + "---|" * len(args.gain) + "---|")
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run_one, [i for i, _ in jobs], [args.seed] * len(jobs), [g for _, g in jobs]))
    by_job = dict(zip(jobs, results, strict=True))
    for index in chosen:
        case = bench.CASES[index]
        cells = []
        for gain in gains:
            metrics, _ = by_job[(index, gain)]
            cells.append(f"{100 * metrics['slo_attainment']:.2f}% at {bench.billed_gpu_hours(metrics):.2f}")
        base, estimated = by_job[(index, None)]
        print(f"| {case.split} | {case.label} | " + " | ".join(cells)
              + f" | {100 * estimated:.2f}% / {100 * (1 - base['slo_attainment']):.2f}% |", flush=True)


if __name__ == "__main__":
    main()

"""Forecasters compared at matched attainment: kvscale with each arrival-rate forecaster pinned, and Auto.

    .venv/bin/python benchmarks/forecasters.py [--json OUT.json] [--cases tuning|evaluation|all] [--only TEXT]
                                               [--seed 1] [--jobs 2] [--weekly]
                                               [--forecasters LastValue,HoltWinters,BurstEnvelope,Auto]

The cases, servers, start-ups and billing are benchmarks/autoscaling.py's, so the two tables read together:
every new replica's start-up is drawn from 60-300 s (seeded; the policy is not told, it measures them), the
servers differ from the planner's model in form (kvscale.sim.server.MEASURED_LIKE_FORM), and GPU-hours are
paid over each trace's span. Tuning cases are those the policy was developed on; evaluation cases were
never tuned on (benchmarks/autoscaling.py says which were added when).

Forecasters differ in attainment as well as in GPU-hours, so GPU-hours alone do not rank them: each run is
also divided by the GPU-hours of the hindsight 5-minute schedule that reaches that run's own attainment
(`matched`, the same search as autoscaling.py's matched_schedule_note). A forecaster that buys attainment
with replicas pays for it there only as far as the schedule would not have. The summary per set is the
geometric mean of that ratio over the set's cases (lower is better) and the mean attainment.

`--weekly` adds the three-day week (the one case long enough for Holt-Winters' daily season; about ten
minutes per run, and no hindsight schedule: its searches would take hours), compared by GPU-hours and
attainment only. Traces: Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024), CC BY 4.0.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

import autoscaling
from kvscale.api.spec import ForecastMode
from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation, with_forecaster
from kvscale.sim import AZURE_ATTRIBUTION

MODES = (ForecastMode.LAST_VALUE, ForecastMode.HOLT_WINTERS, ForecastMode.BURST_ENVELOPE, ForecastMode.AUTO)
HEADER = ("| set | case | policy | SLO attainment | after the first peak | GPU-hours | vs static-peak | "
          "schedule at its attainment | vs that schedule | mean replicas | wall s |")


@dataclass
class Run:
    """One policy's figures on one case."""

    split: str
    case: str
    policy: str
    attainment: float
    gpu_hours: float  # over the trace's span (autoscaling.billed_gpu_hours)
    mean_replicas: float
    wall_s: float
    after_first_peak: float | None = None  # attainment (%) over the requests sent after the first peak
    matched_gpu_hours: float | None = None  # the hindsight schedule's at this run's attainment
    static_gpu_hours: float | None = None
    command: str = ""

    @property
    def vs_matched(self) -> float | None:
        return None if not self.matched_gpu_hours else self.gpu_hours / self.matched_gpu_hours

    def row(self) -> str:
        after = "" if self.after_first_peak is None else f"{self.after_first_peak:.2f}%"
        static = ("" if not self.static_gpu_hours or self.policy == "static-peak"
                  else f"{self.gpu_hours / self.static_gpu_hours:.2f}x")
        matched = "" if self.matched_gpu_hours is None else f"{self.matched_gpu_hours:.2f}"
        ratio = "" if self.vs_matched is None else f"{self.vs_matched:.2f}x"
        return (f"| {self.split} | {self.case} | {self.policy} | {100 * self.attainment:.2f}% | {after} | "
                f"{self.gpu_hours:.2f} | {static} | {matched} | {ratio} | {self.mean_replicas:.2f} | "
                f"{self.wall_s:.1f} |")


@dataclass
class Summary:
    """Per set and forecaster: the runs' GPU-hours over the schedule at their own attainment and their
    attainments, one per case with a matched schedule, and on how many cases the forecaster was the cheapest."""

    split: str
    policy: str
    ratios: list[float] = field(default_factory=list)
    attainments: list[float] = field(default_factory=list)
    cheapest: int = 0

    @property
    def cases(self) -> int:
        return len(self.ratios)

    @property
    def geometric_mean_vs_matched(self) -> float:
        return math.exp(sum(math.log(r) for r in self.ratios) / self.cases)

    @property
    def mean_attainment(self) -> float:
        return sum(self.attainments) / self.cases


def summarize(runs: list[Run]) -> list[Summary]:
    """One Summary per (set, kvscale forecaster) over the cases where the matched schedule was found; ties for
    the cheapest (within 0.5%) count for each forecaster in the tie."""
    summaries: dict[tuple[str, str], Summary] = {}
    by_case: dict[tuple[str, str], list[tuple[Run, float]]] = {}
    for run in runs:
        ratio = run.vs_matched
        if not run.policy.startswith("kvscale") or ratio is None:
            continue
        summary = summaries.setdefault((run.split, run.policy), Summary(run.split, run.policy))
        summary.ratios.append(ratio)
        summary.attainments.append(run.attainment)
        by_case.setdefault((run.split, run.case), []).append((run, ratio))
    for (split, _), case_runs in by_case.items():
        best = min(ratio for _, ratio in case_runs)
        for run, ratio in case_runs:
            if ratio <= best * 1.005:
                summaries[(split, run.policy)].cheapest += 1
    return sorted(summaries.values(), key=lambda s: (s.split != "tuning", s.geometric_mean_vs_matched))


def _command(case: autoscaling.Case, mode: ForecastMode | None, seed: int) -> str:
    policy = "static-peak" if mode is None else f"kvscale --forecaster {mode.value}"
    return autoscaling._command(case, policy, seed)


def run_case(case: autoscaling.Case, seed: int, modes: tuple[ForecastMode, ...] = MODES) -> list[Run]:
    """static-peak and kvscale with each forecaster on one case, each kvscale run against the hindsight schedule
    at its own attainment (a process of its own under --jobs)."""
    autoscaling._use_seed(seed)
    deployment = load_deployment(autoscaling.DATA / case.resource)
    trace = load_trace(case.trace)
    replayed = trace.sped_up(case.speedup)
    runs: list[Run] = []
    met: dict[str, np.ndarray] = {}
    for mode in (None, *modes):
        name = "static-peak" if mode is None else f"kvscale {mode.value}"
        start = time.perf_counter()
        result = run_simulation(deployment if mode is None else with_forecaster(deployment, mode), trace,
                                "static-peak" if mode is None else "kvscale", speedup=case.speedup,
                                config=autoscaling.CONFIG)
        m = result.metrics
        met[name] = result.met_slo
        runs.append(Run(case.split, case.label, name, m["slo_attainment"], autoscaling.billed_gpu_hours(m),
                        m["trace_mean_replicas"], time.perf_counter() - start, command=_command(case, mode, seed)))
    after = autoscaling.attainment_after_first_peak(replayed.arrival_s, met) or {}
    static_gpu_hours = runs[0].gpu_hours
    for run in runs:
        run.after_first_peak = after.get(run.policy)
        run.static_gpu_hours = static_gpu_hours
    if case.references:
        start = time.perf_counter()
        found = autoscaling.smallest_static_fleet(deployment, replayed, 1, 3 * deployment.spec.scaling.max_replicas)
        if found is not None:
            largest = found[0] + 4
            outcomes = autoscaling.fixed_fleet_outcomes(deployment, replayed, largest)
            for run in runs[1:]:
                schedule = autoscaling.hindsight_schedule(deployment, replayed, largest, target=run.attainment,
                                                          outcomes=outcomes)
                run.matched_gpu_hours = None if schedule is None else schedule[2]
        runs[0].wall_s += time.perf_counter() - start  # the searches, on the reference's row
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--cases", choices=("tuning", "evaluation", "all"), default="all")
    parser.add_argument("--only", default="", help="only the cases whose label contains this text")
    parser.add_argument("--seed", type=int, default=autoscaling.STARTUP_SEED,
                        help="the start-up draws' and the servers' jitter seed (the published table: 1)")
    parser.add_argument("--jobs", type=int, default=1, help="cases run in this many processes at once")
    parser.add_argument("--weekly", action="store_true", help="also the three-day week (about 40 CPU-minutes)")
    parser.add_argument("--forecasters", default=",".join(m.value for m in MODES),
                        help="the forecasters to run, comma-separated (default: all four)")
    args = parser.parse_args(argv)
    autoscaling._use_seed(args.seed)
    modes = tuple(ForecastMode(name) for name in args.forecasters.split(","))
    print("forecaster benchmark (command: .venv/bin/python benchmarks/forecasters.py)")
    print(f"traces: {AZURE_ATTRIBUTION}")
    print(f"start-up of each new replica: uniform {autoscaling.STARTUP_RANGE_S[0]:g}-"
          f"{autoscaling.STARTUP_RANGE_S[1]:g} s, seed {args.seed} (not told to the policy)")
    print(f"servers: efficiency factors off the planner's, and in form: {autoscaling.CONFIG.server_form.describe}")
    print("GPU-hours: paid over each trace's span; 'schedule at its attainment': the hindsight 5-min schedule's "
          "GPU-hours at the run's own attainment, the comparison at matched attainment")
    cases = [c for c in autoscaling.CASES
             if "kvscale" in c.policies and args.cases in ("all", c.split) and args.only in c.label
             and (args.weekly or c.references)]
    rows = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    runs: list[Run] = []
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {case: pool.submit(run_case, case, args.seed, modes)
                   for case in sorted(cases, key=autoscaling._simulated_seconds, reverse=True)}
        for case in cases:
            for run in futures[case].result():
                runs.append(run)
                rows.append(run.row())
                print(rows[-1], flush=True)
    print()
    print("\n".join(rows))
    print("\nper set, over the cases with a matched schedule: GPU-hours over the schedule at the run's own "
          "attainment (geometric mean; lower is better), mean attainment, cases where the forecaster is the "
          "cheapest at matched attainment (ties within 0.5% count for each)")
    for s in summarize(runs):
        print(f"  {s.split:10s} {s.policy:25s} {s.geometric_mean_vs_matched:.3f}x over {s.cases} cases, "
              f"mean attainment {100 * s.mean_attainment:.2f}%, cheapest on {s.cheapest}")
    print(f"\n  whole benchmark {time.perf_counter() - started:.0f} s; each row is the same as, e.g.:")
    for run in runs[:2]:
        print(f"  {run.command}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump([{**vars(r), "vs_matched": r.vs_matched} for r in runs], out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

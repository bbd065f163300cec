"""Autoscaling benchmark: every policy on both packaged Azure traces, one table.

    .venv/bin/python benchmarks/autoscaling.py [--json OUT.json] [--plots DIR] [--replan on|off] [--jobs 2]

Each run replays a trace against a simulated fleet of Llama-3.1-8B servers on L4 GPUs (the servers
deliberately slower than the planner's defaults) scaled by one policy: kvscale's own
(`kvscale.autoscaler.decide` with online calibration), a static fleet sized for the trace's peak
minute from a load test of one server (as `vllm bench serve` would measure it), and two
HorizontalPodAutoscaler set-ups with HPA's default behaviour (average KV-cache usage 0.7; waiting
requests per pod 5, as a KEDA queue scaler). Both traces replay in real time, and a synthetic
diurnal day (4 hours) shows the swing that autoscaling is for.
Every new replica's start-up is drawn uniformly from 60-300 s (seeded; no policy is told: kvscale measures
them as the operator does from its pods). The cases are split: the tuning set is what the policy's constants
were developed on; the evaluation set was never run while they were chosen (another seed of the diurnal day,
the packaged traces at other speeds, a three-day week). Each case ends with its goal lines (tracker issue 14):
met or not, with the figures.
Then (unless --replan off) the re-planning cases of benchmarks/replan.py: cost, GPU-hours and attainment with
re-planning on and off, on traffic that drifted from what the spec states.
Traces: Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024), CC BY 4.0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvscale.autoscaler.policy import PATTERN_PEAK_FACTOR, POISSON_PEAK_SIGMAS
from kvscale.cli.simulate_cmd import draw_timeline, load_deployment, load_trace, run_simulation
from kvscale.sim import AZURE_ATTRIBUTION, POLICIES, FleetConfig, SimulatedDeployment, Trace, simulate
from kvscale.sim.policies import StaticPolicy
from kvscale.sim.server import MEASURED_LIKE_FORM
from replan import main as replan_benchmark

TARGET_ATTAINMENT = 0.99

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"


@dataclass(frozen=True)
class Case:
    trace: str
    resource: str
    speedup: float
    name: str = ""  # how the table names the trace (the trace's own name where empty)
    split: str = "tuning"  # tuning or evaluation
    policies: tuple[str, ...] = POLICIES
    references: bool = True  # the hindsight searches (slow on long traces)
    swing: bool = False  # a day's swing: the 40%-below-static-peak goal applies

    @property
    def title(self) -> str:
        return self.name or self.trace

    @property
    def label(self) -> str:
        return f"{self.title} x{self.speedup:g}" + (" (peak stated)" if "peak" in self.resource else "")


# The packaged traces are one hour each: their load moves between 0.5x and 1.5x of the mean within
# minutes, and no further. A day moves further, and that swing is what autoscaling is for: one
# synthetic diurnal cycle (compressed into 4 hours, 0.4x to 1.6x of the conversation trace's mean,
# Poisson arrivals, exponential lengths with the trace's means) runs with the same mean-stated resource.
DIURNAL = ("synthetic:diurnal:rate=5.53:amplitude=0.6:period=14400:duration=14400:input=1155:output=211:"
           "lengths=exponential:seed=0")

# Each trace twice: a resource stating only the mean rate, and one that also states the peak minute
# (peakRequestsPerSecond, the figure static-peak is sized from), which the plan starts for.
# A working week's three days (Sunday, Monday, Tuesday: a weekend day at half a weekday's load), at the
# conversation trace's shape; only kvscale and static-peak run on it (its 78 simulated hours make the HPA
# rows and the hindsight searches too slow for a benchmark that runs in minutes).
WEEKLY = "synthetic:weekly:rate=2:duration=259200:start_day=6:weekend=0.5:input=1155:output=211:lengths=exponential"
# Held out (added 2026-11-26, after every rule of the policy was set; never tuned on): the packaged traces at
# other speeds, and two recurring patterns a start-up of 60-300 s cannot follow: code-like spikes of 20 s
# (12 req/s over 1) every 7 minutes, and conversation surges of 4 minutes (8 req/s over 2) every 15. The
# two patterns are tuning cases since 2026-11-27 (the recurring-peak rule was designed on them).
SPIKES = ("synthetic:bursts:rate=1:burst_rate=12:every=420:length=20:duration=3600:input=2048:output=28:"
          "lengths=exponential:seed=3")
SURGES = ("synthetic:bursts:rate=2:burst_rate=8:every=900:length=240:duration=3600:input=1155:output=211:"
          "lengths=exponential:seed=3")
# Held out (added 2026-11-27, when the recurring-peak rule had been tuned on the two patterns above, which
# thereby became tuning cases; never tuned on): the same kinds of pattern with other periods, rates and
# lengths, each on the other trace's shapes, over two hours: conversation spikes of 30 s (12 req/s over 2)
# every 10 minutes, and code surges of 5 minutes (4 req/s over 1) every 20.
SPIKES_HELD_OUT = ("synthetic:bursts:rate=2:burst_rate=12:every=600:length=30:duration=7200:input=1155:output=211:"
                   "lengths=exponential:seed=7")
SURGES_HELD_OUT = ("synthetic:bursts:rate=1:burst_rate=4:every=1200:length=300:duration=7200:input=2048:output=28:"
                   "lengths=exponential:seed=7")
# The short-peak rule (a standing fleet learned from each peak, 2026-11-27, fifth session) was designed on the
# spikes above and, for its bound by fleets that held, on the 30-s spikes after reading their decisions, which
# thereby became a tuning case. Held out from it (added with the rule set, never tuned on; run once before
# PATTERN_EVIDENCE_PEAKS was chosen on tuning cases, once after): code spikes of 45 s (8 req/s over 1.5) every
# 12 minutes, and conversation spikes of 15 s (16 req/s over 2) every 5.
SPIKES_45S = ("synthetic:bursts:rate=1.5:burst_rate=8:every=720:length=45:duration=7200:input=2048:output=28:"
              "lengths=exponential:seed=11")
SPIKES_15S = ("synthetic:bursts:rate=2:burst_rate=16:every=300:length=15:duration=7200:input=1155:output=211:"
              "lengths=exponential:seed=11")
CASES = (
    Case("azure-conv", "autoscaling-conv.yaml", 1.0),
    Case("azure-conv", "autoscaling-conv-peak.yaml", 1.0),
    Case("azure-code", "autoscaling-code.yaml", 1.0),
    Case("azure-code", "autoscaling-code-peak.yaml", 1.0),
    Case(DIURNAL, "autoscaling-conv.yaml", 1.0, "diurnal-4h", swing=True),
    Case(DIURNAL.replace("seed=0", "seed=1"), "autoscaling-conv.yaml", 1.0, "diurnal-4h seed 1", "evaluation",
         swing=True),
    Case("azure-conv", "autoscaling-conv.yaml", 2.0, split="evaluation"),
    Case("azure-code", "autoscaling-code.yaml", 0.5, split="evaluation"),
    Case(WEEKLY, "autoscaling-conv.yaml", 1.0, "weekly-3d", "evaluation", ("kvscale", "static-peak"), False,
         swing=True),
    Case("azure-conv", "autoscaling-conv.yaml", 1.5, split="evaluation"),
    Case("azure-code", "autoscaling-code.yaml", 0.75, split="evaluation"),
    Case("azure-code", "autoscaling-code.yaml", 1.5, split="evaluation"),
    Case(SPIKES, "autoscaling-code.yaml", 1.0, "spikes 20 s every 7 min"),
    Case(SURGES, "autoscaling-conv.yaml", 1.0, "surges 4 min every 15 min"),
    Case(SPIKES_HELD_OUT, "autoscaling-conv.yaml", 1.0, "spikes 30 s every 10 min"),
    Case(SURGES_HELD_OUT, "autoscaling-code.yaml", 1.0, "surges 5 min every 20 min", "evaluation"),
    Case(SPIKES_45S, "autoscaling-code.yaml", 1.0, "spikes 45 s every 12 min", "evaluation"),
    Case(SPIKES_15S, "autoscaling-conv.yaml", 1.0, "spikes 15 s every 5 min", "evaluation"),
)
STARTUP_RANGE_S = (60.0, 300.0)
STARTUP_SEED = 1
# The servers differ from the planner's model in form too (kvscale.sim.server.MEASURED_LIKE_FORM): attention
# per token grows with context and step overheads jitter; the planner models neither.
CONFIG = FleetConfig(startup_s=STARTUP_RANGE_S[0], startup_range_s=STARTUP_RANGE_S, seed=STARTUP_SEED,
                     server_form=replace(MEASURED_LIKE_FORM, seed=STARTUP_SEED))
MEAN_STARTUP_S = sum(STARTUP_RANGE_S) / 2
# The goals (tracker issue 14, item 5).
SCHEDULE_COST_LIMIT = 1.15  # kvscale's GPU-hours over the hindsight schedule's, where the schedule reaches 99%
SWING_SAVING = 0.40  # fewer GPU-hours than static-peak on a day's swing, at equal or better attainment
STATIC_COST_LIMIT = 0.80  # or: at most this much of static-peak's GPU-hours at equal attainment
EQUAL_ATTAINMENT_PP = 0.1  # "equal" attainment: within this many percentage points


def _command(case: Case, policy: str, seed: int) -> str:
    """The `kvscale simulate` command that reruns one policy on one case with this seed's draws."""
    speed = f" --speedup {case.speedup:g}" if case.speedup != 1 else ""
    return (f".venv/bin/kvscale simulate -f benchmarks/data/{case.resource} --trace '{case.trace}'{speed} "
            f"--policy {policy} --startup-s {STARTUP_RANGE_S[0]:g}-{STARTUP_RANGE_S[1]:g} --seed {seed} "
            "--server-form measured-like -o json")


def billed_gpu_hours(metrics: dict[str, Any]) -> float:
    """A run's GPU-hours over the trace's span, as the hindsight schedule is paid: the simulator runs on after
    the last arrival for the requests in flight to finish (FleetConfig.tail_s), and what a fleet pays then
    (1-15% of a case's GPU-hours, most on the shortest traces) is the trace's end, not its traffic."""
    return float(metrics["trace_gpu_hours"])


def _row(policy: str, trace: str, m: dict[str, Any], wall_s: float) -> str:
    return (f"| {policy} | {trace} | {100 * m['slo_attainment']:.2f}% | {100 * m['ttft_attainment']:.2f}% | "
            f"{100 * m['tpot_attainment']:.2f}% | {m['p99_ttft_ms']:,.0f} | {m['p99_tpot_ms']:,.1f} | "
            f"{billed_gpu_hours(m):.2f} | {m['tokens_per_dollar']:,.0f} | {m['max_replicas']} | "
            f"{m['trace_mean_replicas']:.2f} | {wall_s:.1f} |")


def smallest_static_fleet(deployment: SimulatedDeployment, trace: Trace, low: int, high: int,
                          ) -> tuple[int, dict[str, Any]] | None:
    """In hindsight: the fewest fixed replicas reaching the target attainment (bisection; attainment
    grows with replicas). A reference, not a policy: it needs the whole trace in advance."""
    best: tuple[int, dict[str, Any]] | None = None
    low = max(low, 1)
    while low <= high:
        mid = (low + high) // 2
        m = simulate(deployment, trace, StaticPolicy(mid, 0.0, 0.0), CONFIG).metrics
        if m["slo_attainment"] >= TARGET_ATTAINMENT:
            best, high = (mid, m), mid - 1
        else:
            low = mid + 1
    return best


SCHEDULE_BLOCK_S = 300.0


def fixed_fleet_outcomes(deployment: SimulatedDeployment, trace: Trace, largest: int) -> list[np.ndarray]:
    """Whole-trace runs of fixed fleets of 1..`largest` replicas: per fleet, whether each request met its SLOs."""
    return [simulate(deployment, trace, StaticPolicy(n, 0.0, 0.0), CONFIG).met_slo for n in range(1, largest + 1)]


def hindsight_schedule(deployment: SimulatedDeployment, trace: Trace, largest: int, block_s: float = SCHEDULE_BLOCK_S,
                       target: float = TARGET_ATTAINMENT, outcomes: list[np.ndarray] | None = None,
                       ) -> tuple[list[int], float, float] | None:
    """In hindsight: the cheapest replica count per block of the trace that reaches `target` attainment
    overall, stitched from whole-trace runs of fixed fleets of 1..`largest` replicas (`outcomes`, run here
    when not given; greedy: each step buys the most requests kept per replica-block). Returns (replicas per
    block, attainment, GPU-hours). A bound on what any autoscaler can spend, not a policy: it knows every
    block's load in advance, so it starts each added replica one start-up early (paid at the mean start-up,
    the same distribution the policies draw from), and a backlog never crosses a block boundary.
    """
    blocks = (trace.arrival_s // block_s).astype(np.int64)
    count = int(blocks.max()) + 1
    runs = outcomes if outcomes is not None else fixed_fleet_outcomes(deployment, trace, largest)
    missed = np.stack([np.zeros(count)] + [np.bincount(blocks, weights=~met, minlength=count)
                                           for met in runs[:largest]])  # row n: misses per block with n replicas
    replicas = np.ones(count, dtype=np.int64)
    rows = np.arange(count)
    allowed = (1.0 - target) * trace.requests
    while missed[replicas, rows].sum() > allowed:
        best_gain, best_block, best_step = 0.0, -1, 0
        for step in (1, 2, 3):  # looking a few replicas ahead: a block's misses need not fall at every one
            more = np.minimum(replicas + step, largest)
            gain = (missed[replicas, rows] - missed[more, rows]) / step
            block = int(np.argmax(gain))
            if gain[block] > best_gain:
                best_gain, best_block, best_step = float(gain[block]), block, step
        if best_block < 0:
            return None  # even `largest` replicas in every block miss too often
        replicas[best_block] = min(replicas[best_block] + best_step, largest)
    last_block_s = trace.duration_s - (count - 1) * block_s
    seconds = np.full(count, block_s)
    seconds[-1] = last_block_s
    added = np.maximum(np.diff(replicas), 0).sum()  # the first block's replicas are the fleet at start
    replica_s = float((replicas * seconds).sum()) + float(added) * MEAN_STARTUP_S
    gpu_hours = replica_s * deployment.tensor_parallel / 3600.0
    attainment = 1.0 - float(missed[replicas, rows].sum()) / trace.requests
    return [int(r) for r in replicas], attainment, gpu_hours


def matched_schedule_note(label: str, deployment: SimulatedDeployment, trace: Trace, largest: int,
                          outcomes: list[np.ndarray], kvscale: dict[str, Any]) -> str:
    """kvscale's GPU-hours against the hindsight schedule that reaches kvscale's own attainment (the goal
    lines compare with the one at 99%, which spends the whole 1% on the blocks where misses are cheapest)."""
    found = hindsight_schedule(deployment, trace, largest, target=kvscale["slo_attainment"], outcomes=outcomes)
    if found is None:
        return f"{label}: no schedule of up to {largest} replicas reaches kvscale's attainment"
    _, attained, gpu_hours = found
    return (f"{label}: at kvscale's attainment, the {SCHEDULE_BLOCK_S / 60:g}-min schedule (hindsight) reaches "
            f"{100 * attained:.2f}% at {gpu_hours:.2f} GPU-h; kvscale {100 * kvscale['slo_attainment']:.2f}% at "
            f"{billed_gpu_hours(kvscale):.2f} = {billed_gpu_hours(kvscale) / gpu_hours:.2f}x")


def after_first_peak_s(arrival_s: np.ndarray, longest_startup_s: float) -> float | None:
    """When a trace's first peak has passed and a replica asked for at its start would be Ready: the end of the
    first run of minutes above the policy's peak threshold (PATTERN_PEAK_FACTOR x the median minute, beyond
    Poisson noise: kvscale.autoscaler.policy) plus the longest start-up the simulator draws; None where no
    minute is that far above the median. No policy that is not told the peak in advance serves the requests
    sent before then with a fleet sized for it: only static-peak, sized from the whole trace, does."""
    minutes = np.bincount((np.asarray(arrival_s) // 60.0).astype(np.int64)) / 60.0
    median = float(np.median(minutes))
    threshold = max(PATTERN_PEAK_FACTOR * median, median + POISSON_PEAK_SIGMAS * float(np.sqrt(median / 60.0)))
    above = np.flatnonzero(minutes > threshold)
    if above.size == 0:
        return None
    end = int(above[0])
    while end < minutes.size and minutes[end] > threshold:
        end += 1
    return 60.0 * end + longest_startup_s


def _after_first_peak_mask(arrival_s: np.ndarray) -> tuple[float, np.ndarray] | None:
    """(after_first_peak_s, which requests were sent from then on), or None where the trace has no first peak."""
    warm_s = after_first_peak_s(arrival_s, STARTUP_RANGE_S[1])
    if warm_s is None:
        return None
    return warm_s, np.asarray(arrival_s) >= warm_s


def _attainment(later: np.ndarray, met: dict[str, np.ndarray]) -> dict[str, float]:
    return {policy: 100 * float(np.mean(ok[later])) for policy, ok in met.items()}


def attainment_after_first_peak(arrival_s: np.ndarray, met: dict[str, np.ndarray]) -> dict[str, float] | None:
    """Each policy's attainment (%) over the requests sent after the trace's first peak (after_first_peak_s)."""
    split = _after_first_peak_mask(arrival_s)
    return None if split is None else _attainment(split[1], met)


def first_peak_note(label: str, arrival_s: np.ndarray, met: dict[str, np.ndarray]) -> str:
    """attainment_after_first_peak, and how many of kvscale's misses came before the first peak: where the goal
    lines are lost, before or after it."""
    split = _after_first_peak_mask(arrival_s)
    if split is None:
        return f"{label}: no minute above the peak threshold, so no first peak to split at"
    warm_s, later = split
    shares = ", ".join(f"{policy} {share:.2f}%" for policy, share in _attainment(later, met).items())
    missed = ~met["kvscale"]
    return (f"{label}: after the first peak and a longest start-up (requests sent from {warm_s:.0f} s, "
            f"{int(later.sum())} of {later.size}): {shares}; kvscale's misses before then: "
            f"{int(missed[~later].sum())} of {int(missed.sum())}")


def goal_lines(case: Case, kvscale: dict[str, Any], static: dict[str, Any] | None,
               schedule: tuple[float, float] | None, swing_bound: tuple[float, float] | None = None) -> list[str]:
    """The issue's goals for one case, each met or not, with its figures. `schedule`: (attainment, GPU-hours) of
    the hindsight schedule at 99%; `swing_bound`: the same at the attainment the swing line asks for (static-peak's
    less EQUAL_ATTAINMENT_PP), or None where not searched."""
    lines = []
    att, gpu_h = 100 * kvscale["slo_attainment"], billed_gpu_hours(kvscale)
    if schedule is not None and schedule[0] >= TARGET_ATTAINMENT:
        limit = SCHEDULE_COST_LIMIT * schedule[1]
        met = att >= 100 * TARGET_ATTAINMENT and gpu_h <= limit
        lines.append(f"{'MET' if met else 'NOT MET'}: the 5-min schedule reaches {100 * schedule[0]:.2f}%; kvscale "
                     f"{att:.2f}% (goal >= 99%) at {gpu_h:.2f} GPU-h = {gpu_h / schedule[1]:.2f}x its "
                     f"{schedule[1]:.2f} (goal <= {SCHEDULE_COST_LIMIT:g}x)")
    if static is None:
        return lines
    s_att, s_gpu_h = 100 * static["slo_attainment"], billed_gpu_hours(static)
    if case.swing:
        met = att >= s_att - EQUAL_ATTAINMENT_PP and gpu_h <= (1 - SWING_SAVING) * s_gpu_h
        bound = ""
        if swing_bound is not None:
            # Whether even hindsight meets the line: a goal no schedule of whole replicas reaches says so.
            reach = "within" if swing_bound[1] <= (1 - SWING_SAVING) * s_gpu_h else "beyond"
            bound = (f"; in hindsight the {SCHEDULE_BLOCK_S / 60:g}-min schedule at {100 * swing_bound[0]:.2f}% needs "
                     f"{swing_bound[1]:.2f} GPU-h = {100 * (1 - swing_bound[1] / s_gpu_h):.0f}% fewer: {reach} reach")
        lines.append(f"{'MET' if met else 'NOT MET'}: a day's swing: kvscale {gpu_h:.2f} GPU-h = "
                     f"{100 * (1 - gpu_h / s_gpu_h):.0f}% fewer than static-peak's {s_gpu_h:.2f} (goal >= "
                     f"{100 * SWING_SAVING:.0f}%) at {att:.2f}% vs {s_att:.2f}%{bound}")
    at_least = att >= s_att
    cheaper = gpu_h <= STATIC_COST_LIMIT * s_gpu_h and att >= s_att - EQUAL_ATTAINMENT_PP
    lines.append(f"{'MET' if at_least or cheaper else 'NOT MET'}: vs static-peak: attainment {att:.2f}% vs "
                 f"{s_att:.2f}%, GPU-h {gpu_h:.2f} = {gpu_h / s_gpu_h:.2f}x (goal: attainment at least static-peak's, "
                 f"or <= {STATIC_COST_LIMIT:g}x its GPU-h within {EQUAL_ATTAINMENT_PP:g} pp)")
    return lines


def joint_targets(static: dict[str, Any]) -> tuple[float, float]:
    """The attainments at which a run meets the vs-static-peak line (static-peak's less EQUAL_ATTAINMENT_PP at
    STATIC_COST_LIMIT x its GPU-hours, or its own at any cost), each at least the schedule line's 99%."""
    return (max(TARGET_ATTAINMENT, static["slo_attainment"] - EQUAL_ATTAINMENT_PP / 100),
            max(TARGET_ATTAINMENT, static["slo_attainment"]))


def joint_reach(schedule: tuple[float, float], static: dict[str, Any], within_equal: tuple[float, float] | None,
                at_least: tuple[float, float] | None, largest: int) -> tuple[bool, str]:
    """Whether the schedule line and the vs-static-peak line can both be met on one case, judged by the hindsight
    schedule that knows every block's load (not a goal; the goal lines stand as written). Both lines hold for a
    run at the first of joint_targets within min(SCHEDULE_COST_LIMIT x the 99% schedule's GPU-hours,
    STATIC_COST_LIMIT x static-peak's), or at the second within SCHEDULE_COST_LIMIT x the 99% schedule's.
    `within_equal` and `at_least`: (attainment, GPU-hours) of the hindsight schedules aimed at those two, None
    where no schedule of up to `largest` replicas reaches one. The greedy schedule is a near-cheapest stitch of
    whole replicas per block, not a proof."""
    cost_limit = SCHEDULE_COST_LIMIT * schedule[1]
    s_gpu_h = billed_gpu_hours(static)
    cheap = within_equal is not None and within_equal[1] <= min(cost_limit, STATIC_COST_LIMIT * s_gpu_h)
    higher = at_least is not None and at_least[1] <= cost_limit
    parts = []
    for target, found in zip(joint_targets(static), (within_equal, at_least), strict=True):
        if found is None:
            parts.append(f"no schedule of up to {largest} replicas reaches {100 * target:.2f}%")
        else:
            parts.append(f"aimed at {100 * target:.2f}% it reaches {100 * found[0]:.2f}% at {found[1]:.2f} GPU-h = "
                         f"{found[1] / schedule[1]:.2f}x the 99% schedule's and {found[1] / s_gpu_h:.2f}x "
                         "static-peak's")
    reach = cheap or higher
    return reach, (f"both lines together {'within' if reach else 'beyond'} reach in hindsight: "
                   f"{'; '.join(parts)} (both lines: >= 99% within {SCHEDULE_COST_LIMIT:g}x the 99% schedule's "
                   f"{schedule[1]:.2f}, and static-peak's {100 * static['slo_attainment']:.2f}% less "
                   f"{EQUAL_ATTAINMENT_PP:g} pp within {STATIC_COST_LIMIT:g}x its {s_gpu_h:.2f} or at least its "
                   "attainment)")


def experiment_arguments(description: str) -> argparse.ArgumentParser:
    """The arguments every experiment over these cases takes (docs/experiments): the fleet seed, parallel jobs
    and a label filter; an experiment adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seed", type=int, default=STARTUP_SEED, help="the fleet seed (server jitter)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", default="", help="cases whose label contains this")
    return parser


def referenced_cases(only: str) -> list[int]:
    """Indices into CASES of the cases with hindsight references whose label contains `only`."""
    return [i for i, c in enumerate(CASES) if c.references and only in c.label]


def _use_seed(seed: int) -> None:
    global CONFIG  # one run, one fleet configuration: every policy and hindsight search uses it
    CONFIG = replace(CONFIG, seed=seed, server_form=replace(CONFIG.server_form, seed=seed))


@dataclass
class CaseOutcome:
    rows: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    goals: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    after_first_peak: dict[str, float] | None = None  # attainment_after_first_peak of kvscale and static-peak
    joint_reach: tuple[bool, str] | None = None  # joint_reach, where both the schedule and static lines apply


def run_case(case: Case, seed: int, plots: str | None) -> CaseOutcome:
    """Every policy and the hindsight references on one case (a process of its own under --jobs)."""
    _use_seed(seed)
    out = CaseOutcome()
    deployment = load_deployment(DATA / case.resource)
    trace = load_trace(case.trace)
    label = case.label
    out.notes.append(f"{label}: {deployment.label}, {trace.requests} requests over "
                     f"{trace.duration_s / case.speedup / 60:.0f} min, peak minute "
                     f"{trace.peak_rate() * case.speedup:.1f} req/s, planner goodput "
                     f"{deployment.chosen.goodput_requests_per_s:.2f} req/s per replica (planned "
                     f"{deployment.chosen.replicas} replicas), "
                     f"${deployment.usd_per_gpu_hour:g}/GPU-h")
    by_policy: dict[str, dict[str, Any]] = {}
    met_slo: dict[str, np.ndarray] = {}
    for policy in case.policies:
        start = time.perf_counter()
        result = run_simulation(deployment, trace, policy, speedup=case.speedup, config=CONFIG)
        wall = time.perf_counter() - start
        m = result.metrics
        by_policy[policy] = m
        if policy in ("kvscale", "static-peak"):
            met_slo[policy] = result.met_slo
        out.rows.append(f"| {case.split} " + _row(policy, label, m, wall))
        out.results.append({**m, "split": case.split, "wall_s": round(wall, 2),
                            "command": _command(case, policy, seed)})
        if plots:
            Path(plots).mkdir(parents=True, exist_ok=True)
            draw_timeline(result, Path(plots) / f"{label.replace(' ', '-')}-{policy}.png")
    if "kvscale" in met_slo:
        arrival_s = trace.sped_up(case.speedup).arrival_s
        out.notes.append(first_peak_note(label, arrival_s, met_slo))
        out.after_first_peak = attainment_after_first_peak(arrival_s, met_slo)
    schedule_figures = None
    swing_bound: tuple[float, float] | None = None
    if case.references:
        start = time.perf_counter()
        replayed = trace.sped_up(case.speedup)
        found = smallest_static_fleet(deployment, replayed, 1, 3 * deployment.spec.scaling.max_replicas)
        if found is not None:
            replicas, m = found
            out.rows.append(f"| {case.split} " + _row(f"static-{replicas} (hindsight, not a policy)", label, m,
                                                      time.perf_counter() - start))
            out.notes.append(f"{label}: the fewest fixed replicas reaching {TARGET_ATTAINMENT:.0%} SLO attainment, "
                             f"found by bisection over whole-trace runs: {replicas}")
            start = time.perf_counter()
            outcomes = fixed_fleet_outcomes(deployment, replayed, replicas + 4)
            schedule = hindsight_schedule(deployment, replayed, replicas + 4, outcomes=outcomes)
            if schedule is not None:
                per_block, attained, gpu_hours = schedule
                schedule_figures = (attained, gpu_hours)
                minutes = SCHEDULE_BLOCK_S / 60
                out.rows.append(f"| {case.split} | schedule (hindsight, {minutes:g}-min blocks: a bound, not a policy) "
                                f"| {label} | {100 * attained:.2f}% | | | | | {gpu_hours:.2f} | | {max(per_block)} | "
                                f"{sum(per_block) / len(per_block):.2f} | {time.perf_counter() - start:.1f} |")
                out.notes.append(f"{label}: cheapest replicas per {minutes:g}-min block reaching "
                                 f"{TARGET_ATTAINMENT:.0%} in hindsight: {per_block}")
            out.notes.append(matched_schedule_note(label, deployment, replayed, replicas + 4, outcomes,
                                                   by_policy["kvscale"]))
            static = by_policy.get("static-peak")
            if schedule_figures is not None and schedule_figures[0] >= TARGET_ATTAINMENT and static is not None:
                found_joint = [hindsight_schedule(deployment, replayed, replicas + 4, target=t, outcomes=outcomes)
                               for t in joint_targets(static)]
                within_equal, at_least = ((f[1], f[2]) if f is not None else None for f in found_joint)
                out.joint_reach = joint_reach(schedule_figures, static, within_equal, at_least, replicas + 4)
            if case.swing and static is not None:
                swing_target = static["slo_attainment"] - EQUAL_ATTAINMENT_PP / 100
                found_swing = hindsight_schedule(deployment, replayed, replicas + 4, target=swing_target,
                                                 outcomes=outcomes)
                if found_swing is not None:
                    swing_bound = (found_swing[1], found_swing[2])
    for line in goal_lines(case, by_policy["kvscale"], by_policy.get("static-peak"), schedule_figures, swing_bound):
        out.goals.append(f"{case.split} {label}: {line}")
    return out


def _simulated_seconds(case: Case) -> float:
    """About how long a case takes to run: the simulated time of its trace, times its policies and hindsight
    searches (a policy decides every 15 simulated seconds whatever the load, so time, not requests, sets it:
    the week's kvscale run alone took 27 of the 33.5 minutes of seed 1 with --jobs 2)."""
    searches = 12 if case.references else 0  # a bisection and the schedule's fixed fleets, about
    return load_trace(case.trace).duration_s / case.speedup * (len(case.policies) + searches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every run's metrics here")
    parser.add_argument("--plots", help="draw each run's timeline into this folder")
    parser.add_argument("--cases", choices=("tuning", "evaluation", "all"), default="all")
    parser.add_argument("--replan", choices=("on", "off"), default="on",
                        help="also serve benchmarks/replan.py's drifted-traffic cases with re-planning on and off")
    parser.add_argument("--seed", type=int, default=STARTUP_SEED,
                        help="the start-up draws' and the servers' jitter seed (the published table: 1)")
    parser.add_argument("--only", default="", help="only the cases whose label contains this text")
    parser.add_argument("--jobs", type=int, default=1,
                        help="cases run in this many processes at once (the figures do not depend on it)")
    args = parser.parse_args(argv)
    _use_seed(args.seed)
    print("autoscaling benchmark (command: .venv/bin/python benchmarks/autoscaling.py)")
    print(f"traces: {AZURE_ATTRIBUTION}")
    print(f"start-up of each new replica: uniform {STARTUP_RANGE_S[0]:g}-{STARTUP_RANGE_S[1]:g} s, seed "
          f"{args.seed} (not told to any policy)")
    print(f"servers: efficiency factors off the planner's, and in form: {CONFIG.server_form.describe}")
    print(f"GPU-hours: paid over each trace's span, as the hindsight schedule is (not the {CONFIG.tail_s:g} s "
          "simulated after the last arrival for requests in flight to finish)")
    cases = [c for c in CASES if args.cases in ("all", c.split) and args.only in c.label]
    print("each row is the same as:")
    for case in cases:
        print(f"  {_command(case, '{' + ','.join(case.policies) + '}', args.seed)}")
    # GPU-hours and mean replicas over the trace's span (billed_gpu_hours); tokens/$ at the whole run's cost.
    header = ("| set | policy | trace | SLO attainment | TTFT ok | TPOT ok | p99 TTFT ms | p99 TPOT ms | GPU-hours | "
              "tokens/$ | max replicas | mean replicas | wall s |")
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    results: list[dict[str, Any]] = []
    notes: list[str] = []
    goals: list[str] = []
    after_first_peak: list[dict[str, float]] = []
    reach: list[tuple[bool, str]] = []  # per case with both the schedule and the static line: joint_reach
    start_all = time.perf_counter()
    # Cases are independent: with --jobs N they run in N processes, the longest first (the three-day week alone
    # takes about as long as the rest), and are printed in the table's order.
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {case: pool.submit(run_case, case, args.seed, args.plots)
                   for case in sorted(cases, key=_simulated_seconds, reverse=True)}
        for case in cases:
            outcome = futures[case].result()
            for row in outcome.rows:
                rows.append(row)
                print(row, flush=True)
            notes.extend(outcome.notes)
            results.extend(outcome.results)
            if outcome.after_first_peak is not None and "static-peak" in outcome.after_first_peak:
                after_first_peak.append(outcome.after_first_peak)
            for line in outcome.goals:
                goals.append(line)
                print(f"  goal {line}", flush=True)
            if outcome.joint_reach is not None:
                reach.append((outcome.joint_reach[0], f"{case.split} {case.label}: {outcome.joint_reach[1]}"))
                print(f"  reach {reach[-1][1]}", flush=True)
    total = time.perf_counter() - start_all
    print()
    for note in notes:
        print(f"  {note}")
    print()
    print("\n".join(rows))
    print()
    print("goals (tracker issue 14), per case:")
    for line in goals:
        print(f"  {line}")
    met = sum(line.split(": ", 1)[1].startswith("MET") for line in goals)
    print(f"  {met} of {len(goals)} goal lines met")
    print(f"  the schedule line and the vs-static-peak line together (not a goal; per case below): within reach of "
          f"the hindsight schedule on {sum(r for r, _ in reach)} of the {len(reach)} cases where both apply")
    for _, line in reach:
        print(f"    {line}")
    held = sum(a["kvscale"] >= a["static-peak"] - EQUAL_ATTAINMENT_PP for a in after_first_peak)
    print(f"  after the first peak and a longest start-up (not a goal; per case in the notes above): kvscale's "
          f"attainment is at least static-peak's, within {EQUAL_ATTAINMENT_PP:g} pp, on {held} of the "
          f"{len(after_first_peak)} cases with a first peak")
    print()
    for m in results:
        test = m["policy_detail"].get("load_test")
        if test:
            print(f"  static-peak on {m['trace']}: one server load-tested at {test['rate_per_replica']} req/s holds "
                  f"p{m['slo']['percentile']:g} TTFT {test['ttft_ms']} ms / TPOT {test['tpot_ms']} ms "
                  f"({test['requests_per_rate']} Poisson requests per rate, trace lengths); peak minute "
                  f"{m['policy_detail']['peak_rate_per_s']} req/s -> {m['policy_detail']['replicas']} replicas")
        c = m["policy_detail"].get("calibration")
        if c:
            print(f"  kvscale on {m['trace']}: calibration ended at decode factor {c['decode_factor']}, prefill "
                  f"factor {c['prefill_factor']} (servers: HBM {m['server_efficiency']['hbm_bandwidth']} vs planner "
                  f"{m['planner_efficiency']['hbm_bandwidth']}, compute {m['server_efficiency']['compute']} vs "
                  f"{m['planner_efficiency']['compute']}, step overhead {m['server_efficiency']['step_overhead_ms']} "
                  f"vs {m['planner_efficiency']['step_overhead_ms']} ms); decisions by binding "
                  f"{m['policy_detail']['decisions_by_binding']}")
    replica_hours = sum(m["gpu_hours"] / _tp(m) for m in results)
    policy_wall = sum(m["wall_s"] for m in results)
    print(f"\n  speed: {len(results)} policy runs, {replica_hours:.0f} simulated replica-hours in "
          f"{policy_wall:.1f} s wall (slowest run {max(m['wall_s'] for m in results):.1f} s; "
          f"whole benchmark {total:.1f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.replan == "on":
        # Re-planning (issue 17): GPU-hours and attainment with it on and off, on traffic that drifted from the
        # spec (two cases drift within the run); benchmarks/replan.py alone prints the same with --diagnose.
        print("\nre-planning on and off (tracker issue 17; benchmarks/replan.py):", flush=True)
        return replan_benchmark([])
    return 0


def _tp(m: dict[str, Any]) -> int:
    label = m["deployment"]
    return int(label.split("(TP", 1)[1].split(",", 1)[0])


if __name__ == "__main__":
    sys.exit(main())

"""Forecasters compared: kvscale with each arrival-rate forecaster pinned, and Auto, against static-peak.

    .venv/bin/python benchmarks/forecasters.py [--json OUT.json] [--cases tuning|evaluation|all]

Every run draws each new replica's start-up uniformly from 60-300 s (seeded; the policy is not told:
it measures them, as the operator does from its pods) and sizes for one measured start-up (p90) plus
one decision ahead. The forecasters' constants are a priori textbook values (kvscale.autoscaler.forecast),
not fitted here; the table still keeps the cases the policy was developed on (tuning) apart from cases
it never ran on before this benchmark existed (evaluation: another seed of the diurnal day, the
conversation trace replayed twice as fast, and the code trace at half speed).
Traces: Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024), CC BY 4.0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscale.api.spec import ForecastMode
from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation, with_forecaster
from kvscale.sim import AZURE_ATTRIBUTION, FleetConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
STARTUP_RANGE_S = (60.0, 300.0)
STARTUP_SEED = 1
WARM_UP_S = 300.0


@dataclass(frozen=True)
class Case:
    name: str
    trace: str
    resource: str
    speedup: float
    split: str  # tuning or evaluation


def _diurnal(seed: int) -> str:
    return ("synthetic:diurnal:rate=5.53:amplitude=0.6:period=14400:duration=14400:input=1155:output=211:"
            f"lengths=exponential:seed={seed}")


CASES = (
    Case("azure-conv x1", "azure-conv", "autoscaling-conv.yaml", 1.0, "tuning"),
    Case("azure-code x1", "azure-code", "autoscaling-code.yaml", 1.0, "tuning"),
    Case("diurnal-4h seed 0", _diurnal(0), "autoscaling-conv.yaml", 1.0, "tuning"),
    Case("diurnal-4h seed 1", _diurnal(1), "autoscaling-conv.yaml", 1.0, "evaluation"),
    Case("azure-conv x2", "azure-conv", "autoscaling-conv.yaml", 2.0, "evaluation"),
    Case("azure-code x0.5", "azure-code", "autoscaling-code.yaml", 0.5, "evaluation"),
)
MODES = (ForecastMode.LAST_VALUE, ForecastMode.HOLT_WINTERS, ForecastMode.BURST_ENVELOPE, ForecastMode.AUTO)


def _command(case: Case, policy: str, mode: ForecastMode | None) -> str:
    speed = f" --speedup {case.speedup:g}" if case.speedup != 1 else ""
    forecaster = f" --forecaster {mode.value}" if mode is not None else ""
    return (f".venv/bin/kvscale simulate -f benchmarks/data/{case.resource} --trace '{case.trace}'{speed} "
            f"--policy {policy}{forecaster} --startup-s {STARTUP_RANGE_S[0]:g}-{STARTUP_RANGE_S[1]:g} "
            f"--seed {STARTUP_SEED} -o json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--cases", choices=("tuning", "evaluation", "all"), default="all")
    args = parser.parse_args(argv)
    print("forecaster benchmark (command: .venv/bin/python benchmarks/forecasters.py)")
    print(f"traces: {AZURE_ATTRIBUTION}")
    print(f"start-up of each new replica: uniform {STARTUP_RANGE_S[0]:g}-{STARTUP_RANGE_S[1]:g} s, seed {STARTUP_SEED}"
          " (not told to the policy)")
    config = FleetConfig(startup_s=STARTUP_RANGE_S[0], startup_range_s=STARTUP_RANGE_S, seed=STARTUP_SEED)
    header = ("| set | case | policy | SLO attainment | after the first 5 min | GPU-hours | vs static-peak | "
              "mean replicas | wall s |")
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    for case in CASES:
        if args.cases != "all" and case.split != args.cases:
            continue
        base = load_deployment(DATA / case.resource)
        trace = load_trace(case.trace)
        runs: list[tuple[str, ForecastMode | None]] = [("static-peak", None)] + [("kvscale", m) for m in MODES]
        static_gpu_h = None
        for policy, mode in runs:
            deployment = base if mode is None else with_forecaster(base, mode)
            start = time.perf_counter()
            result = run_simulation(deployment, trace, policy, speedup=case.speedup, config=config)
            m = result.metrics
            wall = time.perf_counter() - start
            # Every run starts with the plan's replicas for the spec's stated rate; where a replay runs faster
            # than the spec says, its first start-up is a backlog no policy could have avoided in time.
            later = trace.sped_up(case.speedup).arrival_s >= WARM_UP_S
            after = float(result.met_slo[later].mean()) if later.any() else float("nan")
            if mode is None:
                static_gpu_h = m["gpu_hours"]
            name = policy if mode is None else f"kvscale {mode.value}"
            ratio = "" if static_gpu_h is None or mode is None else f"{m['gpu_hours'] / static_gpu_h:.2f}x"
            rows.append(f"| {case.split} | {case.name} | {name} | {100 * m['slo_attainment']:.2f}% | "
                        f"{100 * after:.2f}% | {m['gpu_hours']:.2f} | {ratio} | {m['mean_replicas']:.2f} | "
                        f"{wall:.1f} |")
            results.append({"case": case.name, "split": case.split, "policy": name, "wall_s": round(wall, 2),
                            "slo_attainment": m["slo_attainment"], "attainment_after_warm_up": after,
                            "gpu_hours": m["gpu_hours"],
                            "mean_replicas": m["mean_replicas"], "max_replicas": m["max_replicas"],
                            "command": _command(case, policy, mode)})
            print(rows[-1], flush=True)
    print()
    print("\n".join(rows))
    print(f"\n  whole benchmark {time.perf_counter() - started:.0f} s; each row is the same as, e.g.:")
    for r in results[:2]:
        print(f"  {r['command']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

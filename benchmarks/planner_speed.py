"""Planner speed: one full plan of each example, then 100 plans of varied load.

    .venv/bin/python benchmarks/planner_speed.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from kvscale.api.spec import load_resource
from kvscale.planner import build_plan_inputs, plan_deployment

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def main() -> int:
    print("planner speed (command: .venv/bin/python benchmarks/planner_speed.py)")
    for path in EXAMPLES:
        spec = load_resource(path).spec
        start = time.perf_counter()
        plan = plan_deployment(build_plan_inputs(spec))
        elapsed = time.perf_counter() - start
        print(f"  one plan  {path.name:<34} {elapsed * 1e3:8.1f} ms  "
              f"({len(spec.gpu.types)} GPU type(s), {len(plan.alternatives) + len(plan.rejected)} TP options)")
    spec = load_resource(EXAMPLES[0].parent / "llama-3.1-70b-h100.yaml").spec
    durations = []
    start_all = time.perf_counter()
    for i in range(100):
        workload = spec.workload.model_copy(
            update={"requests_per_second": 1.0 + i * 0.5})
        varied = spec.model_copy(update={"workload": workload})
        start = time.perf_counter()
        plan_deployment(build_plan_inputs(varied))
        durations.append(time.perf_counter() - start)
    total = time.perf_counter() - start_all
    print(f"  100 plans of llama-3.1-70b-h100 (1..50.5 req/s): {total:.2f} s total, "
          f"median {statistics.median(durations) * 1e3:.1f} ms, max {max(durations) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

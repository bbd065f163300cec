"""burst_rules_seeds.py with kvscale's policy told the router's pooling as measured by router_pooling.py:
each replica's calibrated goodput x (1 + POOL x (Ready replicas - 1)) (docs/benchmarks.md, 2026-11-27).

Run from the repository root:
    .venv/bin/python docs/experiments/told_router_pooling.py "autoscaling-conv.yaml|azure-conv|1.0;..." 1,2
POOL_CODE (default 0.1: +33% at 4 replicas, +50% at 6, as measured for the code resource) applies where the
TTFT SLO is at most 1 s, POOL_CONV (default 0.04: +12% at 4) elsewhere. A bound on what a router-aware
goodput would buy, not a policy: the factors are the simulator's measured ones.
"""

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import burst_rules_seeds

import kvscale.autoscaler.policy as policy

_replica_goodput = policy.replica_goodput
POOL_CODE = float(os.environ.get("POOL_CODE", "0.1"))
POOL_CONV = float(os.environ.get("POOL_CONV", "0.04"))


def pooled_goodput(context: Any, shape: Any, model: Any = None) -> float:
    pool = POOL_CODE if context.spec.slo.ttft_ms <= 1000 else POOL_CONV
    return _replica_goodput(context, shape, model) * (1.0 + pool * max(context.ready_replicas - 1, 0))


if __name__ == "__main__":
    policy.replica_goodput = pooled_goodput
    burst_rules_seeds.main()

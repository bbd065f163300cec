"""How bursty the packaged traces' arrivals are, beside Poisson's 1: the squared coefficient of variation of
the gaps between requests (what Kingman's GI/G/1 factor takes, spec.scaling.arrivalBurstiness) and the index
of dispersion of the counts per interval (variance / mean), which at long intervals also counts the rate's
drift. Then, for the autoscaling benchmark's two resources at their planned configuration, the replica's goodput
(the planner's default efficiency) at each burstiness: the conversation resource binds on TPOT and barely moves,
the code one binds on TTFT. Run: .venv/bin/python docs/experiments/arrival_burstiness.py (a few seconds)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

from kvscale.api.spec import load_resource
from kvscale.perfmodel import ServingSetup, build_replica_model, estimate_goodput
from kvscale.planner import build_plan_inputs, plan_deployment
from kvscale.planner.search import planned_shape
from kvscale.sim import PACKAGED_TRACES, parse_trace_csv
from kvscale.units import ms_to_s

INTERVALS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BURSTINESS = (1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
RESOURCES = Path(__file__).resolve().parents[2] / "benchmarks" / "data"


def goodput_by_burstiness(resource: Path) -> str:
    spec = load_resource(resource).spec
    inputs = build_plan_inputs(spec)
    chosen = plan_deployment(inputs).chosen
    assert chosen is not None
    model = build_replica_model(ServingSetup(inputs.arch, inputs.gpus[0], chosen.tensor_parallel,
                                             inputs.arch.native_precision))
    cells = []
    for burstiness in BURSTINESS:
        goodput = estimate_goodput(model, planned_shape(spec), [float(chosen.max_num_seqs)], ms_to_s(spec.slo.ttft_ms),
                                   ms_to_s(spec.slo.tpot_ms), spec.slo.percentile / 100.0, burstiness)
        cells.append(f"{float(goodput.request_rate[0]):.2f} ({goodput.binding[0]})")
    return f"{resource.name:28s} " + "  ".join(cells)


def main() -> None:
    print("trace        requests  req/s  gap SCV  " + "  ".join(f"I({t:g} s)" for t in INTERVALS_S))
    for name, file in PACKAGED_TRACES.items():
        trace = parse_trace_csv(resources.files("kvscale.sim").joinpath("data", file).read_bytes(), name)
        arrivals = np.sort(trace.arrival_s) - float(np.min(trace.arrival_s))
        gaps = np.diff(arrivals)
        scv = float(gaps.var() / gaps.mean() ** 2)
        dispersion = []
        for interval_s in INTERVALS_S:
            counts = np.bincount((arrivals // interval_s).astype(np.int64))
            dispersion.append(float(counts.var() / counts.mean()))
        rate = arrivals.size / float(arrivals[-1])
        print(f"{name:12s} {arrivals.size:8d} {rate:6.2f} {scv:8.2f}  "
              + "  ".join(f"{d:8.2f}" for d in dispersion))
    print("\nreplica goodput, req/s (binding), at burstiness " + ", ".join(f"{b:g}" for b in BURSTINESS))
    for name in ("autoscaling-conv.yaml", "autoscaling-code.yaml"):
        print(goodput_by_burstiness(RESOURCES / name))


if __name__ == "__main__":
    main()

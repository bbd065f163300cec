"""How bursty the packaged traces' arrivals are, beside Poisson's 1: the squared coefficient of variation of
the gaps between requests (what Kingman's GI/G/1 factor takes, spec.scaling.arrivalBurstiness) and the index
of dispersion of the counts per interval (variance / mean), which at long intervals also counts the rate's
drift. Run: .venv/bin/python docs/experiments/arrival_burstiness.py (a second)."""

from __future__ import annotations

from importlib import resources

import numpy as np

from kvscale.sim import PACKAGED_TRACES, parse_trace_csv

INTERVALS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


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


if __name__ == "__main__":
    main()

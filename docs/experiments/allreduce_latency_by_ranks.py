"""An all-reduce call latency that grows with the tensor-parallel ranks, tried on the published measurements
and not kept (docs/accuracy.md, 2026-11-27).

Run from the repository root:
    .venv/bin/python docs/experiments/allreduce_latency_by_ranks.py flat 12 ranks 12 ranks 16 flat 20
Each pair is a form and microseconds: `flat N`, every call N us (the default is 12); `ranks N`, N x (TP - 1) / 3
us (N at TP4, 7/3 N at TP8; the PCIe latency scaled alike). Prints the headline medians of
benchmarks/accuracy.py, the other factors at their defaults.
"""

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import accuracy
from kvscale.perfmodel import communication, replica

_estimate_allreduce_s = communication.estimate_allreduce_s


def main() -> None:
    pairs = sys.argv[1:] or ["flat", "12", "ranks", "12"]
    for form, micros in zip(pairs[::2], pairs[1::2], strict=True):
        latency_s = float(micros) * 1e-6

        def estimate(gpu: Any, tensor_parallel: int, message_bytes: Any, efficiency: Any,
                     _form: str = form, _latency_s: float = latency_s) -> Any:
            scale = (tensor_parallel - 1) / 3.0 if _form == "ranks" else 1.0
            pcie = efficiency.pcie_allreduce_latency_s * (scale if _form == "ranks" else 1.0)
            adjusted = replace(efficiency, allreduce_latency_s=_latency_s * scale, pcie_allreduce_latency_s=pcie)
            return _estimate_allreduce_s(gpu, tensor_parallel, message_bytes, adjusted)

        replica.estimate_allreduce_s = estimate  # type: ignore[assignment]
        medians = accuracy.headline_medians(accuracy.run())
        print(f"{form} {micros} us:", ", ".join(f"{key} {error:.1f}%" for key, (error, _) in medians.items()))


if __name__ == "__main__":
    main()

"""A per-sequence cost in every engine step (scheduling, sampling, output handling per running request),
tried on the published measurements and not kept (docs/accuracy.md, 2026-11-27).

Run from the repository root:
    .venv/bin/python docs/experiments/per_sequence_step_cost.py 0 25 50 75 100   # microseconds per sequence
Prints the headline medians of benchmarks/accuracy.py with that cost added to ReplicaModel.step_s for each
decoding and each prefilling sequence, the other factors at their defaults.
"""

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import accuracy
from kvscale.perfmodel import replica

_step_s = replica.ReplicaModel.step_s


def main() -> None:
    for micros in sys.argv[1:] or ["0", "50"]:
        cost_s = float(micros) * 1e-6

        def step_s(self: replica.ReplicaModel, decode_seqs: Any, context_tokens: Any, prefill_tokens: Any = 0.0,
                   prefill_attention_pairs: Any = 0.0, prefill_seqs: Any = 0.0, _cost_s: float = cost_s) -> Any:
            sequences = np.asarray(decode_seqs, dtype=np.float64) + np.asarray(prefill_seqs, dtype=np.float64)
            return _step_s(self, decode_seqs, context_tokens, prefill_tokens, prefill_attention_pairs,
                           prefill_seqs) + _cost_s * sequences

        replica.ReplicaModel.step_s = step_s  # type: ignore[method-assign]
        medians = accuracy.headline_medians(accuracy.run())
        print(f"{micros:>5} us/sequence:", ", ".join(f"{key} {error:.1f}%" for key, (error, _) in medians.items()))


if __name__ == "__main__":
    main()

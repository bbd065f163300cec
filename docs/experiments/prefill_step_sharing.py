"""What shares a prompt's prefill steps: every engine step of one simulated server that is the planner's model.

Run from the repository root:
    .venv/bin/python docs/experiments/prefill_step_sharing.py [RATE ...]    # default 1 2 (requests/s)

The setting of docs/experiments/prefill_one_server.py (one replica of examples/llama-3.1-8b-l4.yaml at the planner's
efficiency and form, 15 minutes of Poisson arrivals, exponential prompt and output lengths of means 1155 and 211),
with each engine step recorded: which prompts it carried and how many of their tokens. For the requests arriving
after the first minute and before the last, it prints the share of prompts that span several steps and, per
prompt length, the mean prefill time (first scheduled step to first token, vLLM's request_prefill_time_seconds),
the steps it took, and what its first step carried besides its own tokens: the unfinished rest of prompts already
in progress (scheduled first) and prompts newly scheduled with it. The last line sets the shortest prompts' time
beside the mean prompt's own step scaled by length, which a step linear in its tokens would give.
(docs/benchmarks.md, thirty-second session.)
"""

from __future__ import annotations

import sys

import numpy as np
from prefill_one_server import exact_deployment, poisson_trace  # this folder: the same server and arrivals

from kvscale.perfmodel import build_replica_model
from kvscale.sim import FleetConfig, server, simulate
from kvscale.sim.policies import StaticPolicy

CLASSES = ((0, 300), (300, 1000), (1000, 2000), (2000, 4000), (4000, 10**9))


def record_steps(rate_per_s: float) -> tuple[dict[int, list[tuple[float, int, int, int]]], np.ndarray, np.ndarray]:
    """Per request, its prefill steps: (seconds, prompt tokens in the step, of them the rest of prompts already
    in progress other than its own, its own prompt length); and the trace's arrivals and prompt lengths."""
    steps: dict[int, list[tuple[float, int, int, int]]] = {}
    original = server.Replica._step

    def recorded(self: server.Replica) -> None:
        before = {id(seq): (seq, seq.computed) for seq in [*self.prefilling, *self.waiting]}
        started = self.clock
        original(self)
        took = [(seq, seq.computed - computed) for seq, computed in before.values() if seq.computed != computed]
        total = sum(tokens for _, tokens in took)
        in_progress = sum(tokens for seq, tokens in took if before[id(seq)][1] > 0)
        for seq, tokens in took:
            own_rest = tokens if before[id(seq)][1] > 0 else 0
            steps.setdefault(seq.req, []).append((self.clock - started, total, in_progress - own_rest, seq.prompt))

    trace = poisson_trace(rate_per_s)
    server.Replica._step = recorded  # type: ignore[method-assign]
    try:
        simulate(exact_deployment(), trace, StaticPolicy(1), FleetConfig(tail_s=60.0))
    finally:
        server.Replica._step = original  # type: ignore[method-assign]
    return steps, trace.arrival_s, trace.input_tokens


def main() -> None:
    rates = [float(r) for r in sys.argv[1:]] or [1.0, 2.0]
    print(f"command: .venv/bin/python docs/experiments/prefill_step_sharing.py {' '.join(f'{r:g}' for r in rates)}")
    model = build_replica_model(exact_deployment().setup)
    for rate in rates:
        steps, arrivals, _ = record_steps(rate)
        kept = [r for r in steps if 60.0 < arrivals[r] < arrivals[-1] - 60.0]
        prefill = np.array([sum(step[0] for step in steps[r]) for r in kept])
        count = np.array([len(steps[r]) for r in kept])
        prompt = np.array([steps[r][0][3] for r in kept])
        first_tokens = np.array([steps[r][0][1] for r in kept])
        rest_of_others = np.array([steps[r][0][2] for r in kept])
        own_first = np.minimum(prompt, first_tokens - rest_of_others)
        print(f"{rate:g} req/s, token budget {model.setup.token_budget}: {len(kept)} requests, mean prefill "
              f"{prefill.mean():.4f} s, {np.mean(count > 1):.0%} of prompts span several steps")
        print("| prompt tokens | share | mean prefill s | steps | first step: others' unfinished rest (present) "
              "| first step: newly scheduled others |")
        print("|---|---|---|---|---|---|")
        for low, high in CLASSES:
            inside = (prompt >= low) & (prompt < high)
            if not inside.any():
                continue
            others_new = first_tokens[inside] - own_first[inside] - rest_of_others[inside]
            print(f"| {low}-{high if high < 10**9 else ''} | {inside.mean():.3f} | {prefill[inside].mean():.4f} | "
                  f"{count[inside].mean():.2f} | {rest_of_others[inside].mean():.0f} "
                  f"({np.mean(rest_of_others[inside] > 0):.0%}) | {others_new.mean():.0f} |")
        short = prompt < 300
        alone = float(np.mean(prefill[(prompt > 0.9 * prompt.mean()) & (prompt < 1.1 * prompt.mean())]))
        print(f"prompts under 300 tokens (mean {prompt[short].mean():.0f}): {prefill[short].mean():.4f} s; prompts "
              f"within 10% of the mean ({prompt.mean():.0f}) take {alone:.4f} s, which scaled by length gives "
              f"{alone * prompt[short].mean() / prompt.mean():.4f} s")


if __name__ == "__main__":
    main()

"""Where short requests' TPOT tail comes from in the simulator (docs/accuracy.md, 2026-11-29).

Run from the repository root:
    .venv/bin/python docs/experiments/tpot_tail_sources.py code 0.25 6 8 [--tail-ms 40]
Arguments: a case of benchmarks/model_vs_sim.py (the start of its name), the load as a fraction of the
planned goodput, and the output-length range [low, high) of the requests looked at. One seeded run of
model_vs_sim's open loop, with every engine step recorded. For each request in the range, every other
prompt whose chunks share a step with its decode steps is counted, by when it arrived: during the
request's TTFT (queued behind it: "before") or while it decodes, in a decode-only step or in a step that
already carried prompt chunks. Each prompt's share of a step's extra time (the step minus the same step
without prompt tokens) is in proportion to the tokens it took in that step. Prints the counts and
mean sizes per request, the same for the requests whose TPOT is above `--tail-ms`, and how many prompts the
model counts as queued before the first token (kvscale.perfmodel.latency.tpot_quantile_s).
"""

import argparse
import sys
from typing import Any

import numpy as np

sys.path.insert(0, "benchmarks")


def main() -> None:
    import kvscale.sim.server as server
    import model_vs_sim as mvs
    from kvscale.perfmodel import estimate_at_rate

    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("load", type=float)
    parser.add_argument("low", type=int)
    parser.add_argument("high", type=int)
    parser.add_argument("--tail-ms", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    case = next(c for c in mvs.CASES if c.name.startswith(args.case))
    planned = mvs.planned_case(case)
    trace, spec, deployment, shape = planned.trace, planned.spec, planned.deployment, planned.shape
    model, slots = planned.model, planned.slots
    rate = args.load * deployment.chosen.goodput_requests_per_s
    promise = estimate_at_rate(model, shape, rate, slots, spec.slo.percentile / 100.0)

    steps: list[tuple[float, float, float, dict[int, int]]] = []  # start, end, extra s, prompt tokens per request
    original_step = server.Replica._step

    def recorded_step(self: Any) -> None:
        start = self.clock
        computed = {s.req: s.computed for s in self.prefilling}
        prefilling, waiting = list(self.prefilling), list(self.waiting)
        decoders, context = self.decoders, self.decode_base + self.decoders * (self.steps + 1)
        original_step(self)
        decode_only = self.cost.step_s(decoders, context) if decoders else 0.0
        took = {s.req: (s.computed if s in self.prefilling else s.target) - computed[s.req] for s in prefilling}
        took |= {s.req: (s.computed if s in self.prefilling else s.target) for s in waiting if s not in self.waiting}
        steps.append((start, self.clock, max(self.clock - start - decode_only, 0.0), took))

    server.Replica._step = recorded_step  # decode-only stretches run elsewhere and carry no prompt work
    log = mvs.replayed_log(deployment, trace, rate, args.seed)
    server.Replica._step = original_step

    arrival, first, finish, outputs = log.arrival_s, log.first_token_s, log.finish_s, log.output_tokens
    delay = model.setup.efficiency.ttft_overhead_s(model.arch.num_layers)  # the API's share (the replica's)
    starts = np.array([s[0] for s in steps])
    ends = np.array([s[1] for s in steps])
    carries_prompt = np.array([s[2] > 1e-6 for s in steps])
    kinds = ("before", "in a decode step", "in a prompt step")

    def sources(i: int) -> dict[str, list[float]]:
        found: dict[str, list[float]] = {k: [] for k in kinds}
        lo = np.searchsorted(starts, first[i] - delay - 1e-12)
        hi = np.searchsorted(ends, finish[i] - delay + 1e-12, side="right")
        share: dict[int, float] = {}
        for _start, _end, extra, took in steps[lo:hi]:
            total = sum(took.values())
            if extra <= 1e-6 or total <= 0:
                continue
            for j, tokens in took.items():
                if j != i:
                    share[j] = share.get(j, 0.0) + extra * tokens / total
        for j, seconds in share.items():
            if arrival[j] < first[i] - delay:
                found["before"].append(seconds)
                continue
            k = np.searchsorted(ends, arrival[j])
            in_prompt_step = k < len(steps) and starts[k] <= arrival[j] and carries_prompt[k]
            found["in a prompt step" if in_prompt_step else "in a decode step"].append(seconds)
        return found

    chosen = [i for i in range(mvs.WARMUP, arrival.size) if args.low <= outputs[i] < args.high]
    tpot = {i: (finish[i] - first[i]) / (outputs[i] - 1) for i in chosen}
    ttft_mean = float(np.mean([first[i] - arrival[i] for i in chosen]))
    print(f"{case.name} at {args.load:g} of goodput ({rate:.2f} req/s), outputs [{args.low}, {args.high}): "
          f"{len(chosen)} requests, TTFT mean {ttft_mean * 1e3:.0f} ms (rate x TTFT = {rate * ttft_mean:.3f})")
    overhead_s = delay
    print(f"model: TTFT mean {float(promise.ttft_mean_s) * 1e3:.0f} ms; prompts queued before the first token: "
          f"rate x (TTFT - API overhead) = {rate * (float(promise.ttft_mean_s) - overhead_s):.3f} "
          f"(until 2026-11-29 rate x TTFT / 2 = {rate * float(promise.ttft_mean_s) / 2:.3f})")
    for label, group in (("all", chosen), (f"TPOT > {args.tail_ms:g} ms", [i for i in chosen
                                                                          if tpot[i] > args.tail_ms / 1e3])):
        found: dict[str, list[float]] = {k: [] for k in kinds}
        for i in group:
            for k, sizes in sources(i).items():
                found[k] += sizes
        count = max(len(group), 1)
        parts = ", ".join(f"{k} {len(v) / count:.3f} ({np.mean(v) * 1e3:.0f} ms)" if v else f"{k} 0"
                          for k, v in found.items())
        print(f"  {label} ({len(group)} requests, {len(group) / max(len(chosen), 1):.2%}): prompts per request "
              f"sharing its decode steps, by arrival (mean time each adds): {parts}")


if __name__ == "__main__":
    main()

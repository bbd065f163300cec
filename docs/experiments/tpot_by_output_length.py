"""TPOT percentiles by output length, simulated against promised, and the batch each request finds
(docs/accuracy.md, "The batch a request finds", 2026-11-29).

Run from the repository root:
    .venv/bin/python docs/experiments/tpot_by_output_length.py shared 0.9
Arguments: a case of benchmarks/model_vs_sim.py (the start of its name) and the load as a fraction of the
planned goodput. Prints the model's mean and SLO-percentile TPOT beside the simulator's (model_vs_sim's
four pooled runs), then, for one seeded run, per band of output lengths: the share of requests and the
p50 / p90 / p95 TPOT, simulated and promised (the model's tail for requests of that one length). Last,
for the requests of 160 outputs or more: how their TPOT varies with the requests in the server when
they start decoding, and with the arrivals and prompt tokens during their life.
"""

import sys
from typing import Any

import numpy as np

sys.path.insert(0, "benchmarks")

BANDS = ((2, 5), (5, 10), (10, 20), (20, 40), (40, 80), (80, 160), (160, 320), (320, 100_000))


def main() -> None:
    import kvscale.perfmodel.serving as serving
    import model_vs_sim as mvs
    from kvscale.perfmodel import estimate_at_rate

    case = next(c for c in mvs.CASES if c.name.startswith(sys.argv[1]))
    load = float(sys.argv[2])
    planned = mvs.planned_case(case)
    trace, spec, deployment, shape = planned.trace, planned.spec, planned.deployment, planned.shape
    model, slots = planned.model, planned.slots
    rate = load * deployment.chosen.goodput_requests_per_s
    quantile = spec.slo.percentile / 100.0

    recorded: dict[str, Any] = {}
    original = serving.tpot_quantile_s

    def recording(*args: Any) -> Any:
        recorded["args"] = list(args)
        return original(*args)

    serving.tpot_quantile_s = recording
    promise = estimate_at_rate(model, shape, rate, slots, quantile)
    serving.tpot_quantile_s = original
    runs = [mvs.run_open_loop(deployment, trace, rate, mvs.REQUESTS, seed=seed, warmup=mvs.WARMUP)
            for seed in range(mvs.SEEDS)]
    pooled = np.concatenate([run.tpot_s for run in runs])
    print(f"{case.name} at {load:g} of goodput ({rate:.2f} req/s): TPOT p{spec.slo.percentile:g} "
          f"{np.percentile(pooled, spec.slo.percentile) * 1e3:.1f} ms simulated, "
          f"{float(promise.tpot_quantile_s) * 1e3:.1f} promised; mean {pooled.mean() * 1e3:.1f} and "
          f"{float(promise.tpot_mean_s) * 1e3:.1f}; the model's batch {float(promise.running_seqs):.1f}")

    log = mvs.replayed_log(deployment, trace, rate, seed=0)
    w = mvs.WARMUP
    first, finish = log.first_token_s[w:], log.finish_s[w:]
    outputs = log.output_tokens[w:].astype(np.float64)
    many = outputs > 1
    tpot = (finish - first)[many] / (outputs[many] - 1.0)
    lengths = outputs[many]
    print("outputs       share   simulated p50 / p90 / p95   promised p50 / p90 / p95 (ms)")
    for low, high in BANDS:
        band = (lengths >= low) & (lengths < high)
        if not np.any(band):
            continue
        typical = float(np.exp(np.mean(np.log(lengths[band]))))
        promised = []
        for q in (0.5, 0.9, 0.95):
            args = list(recorded["args"])
            args[10], args[11] = q, ((0.5, typical),)
            promised.append(float(original(*args)) * 1e3)
        simulated = [np.percentile(tpot[band], p) * 1e3 for p in (50, 90, 95)]
        label = f"[{low}, {high})" if high < 100_000 else f"{low}+"
        print(f"{label:<11}{band.mean():6.3f}   "
              f"{' / '.join(f'{x:5.1f}' for x in simulated)}          {' / '.join(f'{x:5.1f}' for x in promised)}")

    long_ones = np.nonzero(outputs >= 160)[0]
    starts, ends = first[long_ones], finish[long_ones]
    life_s = ends - starts
    all_arrivals = log.arrival_s
    finished = np.sort(log.finish_s)
    in_server = np.searchsorted(all_arrivals, starts) - np.searchsorted(finished, starts)
    arrivals = np.searchsorted(all_arrivals, ends) - np.searchsorted(all_arrivals, starts)
    tokens = np.concatenate([[0.0], np.cumsum(log.input_tokens.astype(np.float64))])
    prompt_tokens = tokens[np.searchsorted(all_arrivals, ends)] - tokens[np.searchsorted(all_arrivals, starts)]
    long_tpot = life_s / (outputs[long_ones] - 1.0)
    print(f"requests of 160+ outputs ({long_ones.size}): TPOT sd {long_tpot.std() * 1e3:.2f} ms")
    for name, x in (("requests in the server when it starts decoding", in_server.astype(np.float64)),
                    ("arrivals per second of its life", arrivals / life_s),
                    ("prompt tokens per second of its life, cached ones included", prompt_tokens / life_s)):
        print(f"  {name}: mean {x.mean():.1f}, sd {x.std():.1f}, correlation with its TPOT "
              f"{np.corrcoef(x, long_tpot)[0, 1]:.2f}")


if __name__ == "__main__":
    main()

"""`kvscale simulate -f FILE --trace TRACE [--policy P] [--speedup N] [--duration-s S] [-o json] [--plot PNG]`.

The edge of the simulator: reads the resource and the trace (a CSV file, a packaged trace by name,
or a synthetic spec), runs `kvscale.sim`, prints a summary or JSON and draws the timeline.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from kvscale.api.spec import ForecastMode
from kvscale.errors import InvalidSpecError, KvscaleError

if TYPE_CHECKING:
    from kvscale.sim import FleetConfig, SimulatedDeployment, SimulationResult, Trace

# Kept here so that building the parser does not import the simulator (tests check they match).
POLICY_NAMES = ("kvscale", "static-peak", "hpa-kv", "hpa-queue")
TRACE_NAMES = ("azure-conv", "azure-code")
SERVER_FORM_NAMES = ("model", "measured-like")


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", required=True, help="LLMDeployment YAML (planned as `kvscale plan` would)")
    parser.add_argument("--trace", required=True,
                        help="CSV (.csv or .csv.gz: TIMESTAMP,ContextTokens,GeneratedTokens), a packaged trace "
                             f"({', '.join(TRACE_NAMES)}) or synthetic:poisson|diurnal|bursts|weekly:rate=5:"
                             "duration=3600 (keys in kvscale.sim.synthetic; a drifting shape: "
                             "input_to=6000:output_to=150:drift=linear|daily)")
    parser.add_argument("--speedup", type=float, default=1.0, help="replay arrivals N times faster")
    parser.add_argument("--policy", choices=POLICY_NAMES, default="kvscale")
    parser.add_argument("--duration-s", type=float, help="simulate only the first S seconds of the (sped-up) trace")
    parser.add_argument("--startup-s", type=parse_startup_s, default=(120.0, 120.0), metavar="S|MIN-MAX",
                        help="seconds from scale-up to a Ready replica, or a range each new replica's start-up is "
                             "drawn from uniformly (e.g. 60-300; the policy measures it, it is not told)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the start-up draws (and of the step jitter)")
    parser.add_argument("--server-form", choices=SERVER_FORM_NAMES, default="model",
                        help="model: the servers' steps have the planner's form (only its efficiency factors "
                             "differ); measured-like: attention cost per token grows with context and step "
                             "overheads jitter, neither of which the planner models")
    parser.add_argument("--forecaster", choices=[m.value for m in ForecastMode],
                        help="override the resource's spec.scaling.forecaster (kvscale policy)")
    parser.add_argument("--cluster-gpus", type=int, help="GPUs of the planned type in the cluster (default: unlimited)")
    parser.add_argument("--initial-replicas", type=int, help="replicas at the start (default: the plan's)")
    parser.add_argument("--no-calibration", action="store_true", help="kvscale policy without online calibration")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    parser.add_argument("--timeline", action="store_true", help="with -o json: include the per-scrape timeline")
    parser.add_argument("--plot", metavar="PNG", help="draw load, replicas and latency over time")


def parse_startup_s(text: str) -> tuple[float, float]:
    """`120` or `60-300` (seconds) as (low, high)."""
    try:
        parts = [float(p) for p in text.split("-", 1)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--startup-s {text!r}: seconds, or MIN-MAX such as 60-300") from exc
    low, high = parts[0], parts[-1]
    if low < 0 or high < low:
        raise argparse.ArgumentTypeError(f"--startup-s {text!r}: 0 <= MIN <= MAX")
    return low, high


def with_forecaster(deployment: SimulatedDeployment, mode: ForecastMode) -> SimulatedDeployment:
    """The same deployment with its scaler's forecaster set to `mode`."""
    scaling = deployment.spec.scaling.model_copy(update={"forecaster": mode})
    return replace(deployment, spec=deployment.spec.model_copy(update={"scaling": scaling}))


def read_packaged_trace(name: str) -> bytes:
    """The gzip bytes of a trace shipped in kvscale/sim/data."""
    from kvscale.sim import PACKAGED_TRACES

    return resources.files("kvscale.sim").joinpath("data", PACKAGED_TRACES[name]).read_bytes()


def load_trace(text: str) -> Trace:
    """A trace from a packaged name, a synthetic spec or a CSV path."""
    from kvscale.sim import AZURE_ATTRIBUTION, PACKAGED_TRACES, generate_synthetic_trace, parse_trace_csv
    from kvscale.sim.synthetic import PREFIX as SYNTHETIC_PREFIX

    if text.startswith(SYNTHETIC_PREFIX):
        return generate_synthetic_trace(text)
    if text in PACKAGED_TRACES:
        return parse_trace_csv(read_packaged_trace(text), text, AZURE_ATTRIBUTION)
    path = Path(text)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidSpecError(f"--trace {text}: cannot read: {exc.strerror or exc}") from exc
    attribution = AZURE_ATTRIBUTION if path.name.startswith("azure-llm-2023") else None
    return parse_trace_csv(data, path.name, attribution)


def load_deployment(path: Path) -> SimulatedDeployment:
    from kvscale.cli.resource import load_resource_with_config
    from kvscale.planner import build_plan_inputs
    from kvscale.sim import build_simulated_deployment

    resource, config = load_resource_with_config(path)
    return build_simulated_deployment(build_plan_inputs(resource.spec, config))


def run_simulation(deployment: SimulatedDeployment, trace: Trace, policy_name: str, *, speedup: float = 1.0,
                   duration_s: float | None = None, config: FleetConfig | None = None,
                   initial_replicas: int | None = None, calibrated: bool = True) -> SimulationResult:
    from kvscale.sim import FleetConfig, build_policy, simulate

    trace = trace.sped_up(speedup)
    if duration_s is not None:
        trace = trace.truncated(duration_s)
    config = config or FleetConfig()
    # static-peak load-tests the servers the fleet runs, in their form (measured-like where asked)
    policy = build_policy(policy_name, deployment, trace, initial_replicas, calibrated, config.server_form)
    return simulate(deployment, trace, policy, config)


def render_result(result: SimulationResult) -> str:
    m = result.metrics
    slo = m["slo"]
    server, planner = m["server_efficiency"], m["planner_efficiency"]
    lines = [
        f"{m['policy']} on {m['trace']}: {m['deployment']}",
        f"  SLO p{slo['percentile']:g} TTFT {slo['ttft_ms']:g} ms / TPOT {slo['tpot_ms']:g} ms; "
        f"{m['duration_s']:g} s of trace, {m['simulated_s']:g} s simulated",
        f"  requests {m['requests']}: completed {m['completed']}, dropped {m['dropped']}, "
        f"unfinished {m['unfinished']}, preemptions {m['preemptions']}",
        f"  SLO attainment {100 * (m['slo_attainment'] or 0):.2f}% (TTFT {100 * (m['ttft_attainment'] or 0):.2f}%, "
        f"TPOT {100 * (m['tpot_attainment'] or 0):.2f}%); goodput {m['goodput_tokens_per_s']:.1f} output tok/s",
        f"  TTFT ms p50/p95/p99 {m['p50_ttft_ms']} / {m['p95_ttft_ms']} / {m['p99_ttft_ms']}; "
        f"TPOT ms p50/p95/p99 {m['p50_tpot_ms']} / {m['p95_tpot_ms']} / {m['p99_tpot_ms']}",
        f"  GPU-hours {m['gpu_hours']:.2f} ({m['trace_gpu_hours']:.2f} while the trace ran), cost ${m['cost']:.2f} at "
        f"${m['usd_per_gpu_hour']:g}/GPU-h, "
        f"{m['tokens_per_dollar'] or 0:,.0f} SLO-compliant tokens per dollar",
        f"  replicas: max {m['max_replicas']}, mean {m['mean_replicas']:.2f}, started {m['replicas_started']}",
        f"  servers vs planner: HBM efficiency {server['hbm_bandwidth']} vs {planner['hbm_bandwidth']}, compute "
        f"{server['compute']} vs {planner['compute']}, step overhead {server['step_overhead_ms']} ms vs "
        f"{planner['step_overhead_ms']} ms: the servers are slower than the planner assumes",
    ]
    calibration = m["policy_detail"].get("calibration")
    if calibration:
        state = "on" if calibration["enabled"] else "off"
        lines.append(f"  calibration ({state}): decode factor {calibration['decode_factor']}, prefill factor "
                     f"{calibration['prefill_factor']} after {calibration['samples']} samples")
    if m.get("attribution"):
        lines.append(f"  trace: {m['attribution']}")
    return "\n".join(lines)


def draw_timeline(result: SimulationResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = result.metrics
    points = result.timeline
    minutes = [p.t_s / 60.0 for p in points]
    fig, (load, replicas, latency) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    load.plot(minutes, [p.arrival_rate for p in points], label="arrivals/s", linewidth=0.8)
    load.plot(minutes, [p.waiting for p in points], label="waiting requests", linewidth=0.8)
    load.set_ylabel("load")
    load.legend(fontsize=8)
    replicas.step(minutes, [p.desired_replicas for p in points], where="post", label="desired")
    replicas.step(minutes, [p.ready_replicas for p in points], where="post", label="ready")
    replicas.set_ylabel("replicas")
    replicas.legend(fontsize=8)
    slo = m["slo"]
    q = f"p{slo['percentile']:g}"
    latency.plot(minutes, [1e3 * p.ttft_s if p.ttft_s is not None else float("nan") for p in points],
                 label=f"{q} TTFT (ms)", linewidth=0.8)
    latency.plot(minutes, [1e3 * p.tpot_s if p.tpot_s is not None else float("nan") for p in points],
                 label=f"{q} TPOT (ms)", linewidth=0.8)
    latency.axhline(slo["ttft_ms"], color="C0", linestyle="--", linewidth=0.6)
    latency.axhline(slo["tpot_ms"], color="C1", linestyle="--", linewidth=0.6)
    latency.set_yscale("log")
    latency.set_ylabel("latency, 1-min window")
    latency.set_xlabel("minutes")
    latency.legend(fontsize=8)
    fig.suptitle(f"{m['policy']} on {m['trace']}: SLO attainment {100 * (m['slo_attainment'] or 0):.1f}%, "
                 f"{m['gpu_hours']:.1f} GPU-h", fontsize=10)
    if m.get("attribution"):
        fig.text(0.01, 0.005, f"Trace: {m['attribution']}", fontsize=6)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise KvscaleError(f"cannot write {path}: {exc}") from exc
    finally:
        plt.close(fig)


def run_simulate(args: argparse.Namespace) -> int:
    from kvscale.sim import FleetConfig

    deployment = load_deployment(Path(args.file))
    trace = load_trace(args.trace)
    if args.cluster_gpus is not None and args.cluster_gpus < deployment.gpus_per_replica:
        raise InvalidSpecError(
            f"--cluster-gpus {args.cluster_gpus} holds no replica of {deployment.chosen.parallelism}")
    if args.forecaster:
        deployment = with_forecaster(deployment, ForecastMode(args.forecaster))
    from kvscale.sim.server import SERVER_FORMS

    low, high = args.startup_s
    config = FleetConfig(startup_s=low, startup_range_s=None if low == high else (low, high), seed=args.seed,
                         cluster_gpus=args.cluster_gpus,
                         server_form=replace(SERVER_FORMS[args.server_form], seed=args.seed))
    result = run_simulation(deployment, trace, args.policy, speedup=args.speedup, duration_s=args.duration_s,
                            config=config, initial_replicas=args.initial_replicas,
                            calibrated=not args.no_calibration)
    if args.output == "json":
        print(json.dumps(result.to_dict(with_timeline=args.timeline), indent=2))
    else:
        print(render_result(result))
    if args.plot:
        draw_timeline(result, Path(args.plot))
        if args.output != "json":
            print(f"timeline chart written to {args.plot}")
    return 0

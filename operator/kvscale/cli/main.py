"""Argument parsing and dispatch. Errors kvscale owns become one readable line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvscale.api.spec import KvCacheDtype, Precision
from kvscale.controllers.peering import DEFAULT_PEERING_LIFETIME_S
from kvscale.errors import KvscaleError
from kvscale.metrics.queries import DEFAULT_WINDOW_S


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvscale", description="Capacity planning and autoscaling for LLM serving.")
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="plan the cheapest SLO-compliant deployment of an LLMDeployment file")
    plan.add_argument("-f", "--file", required=True, help="LLMDeployment YAML")
    plan.add_argument("-o", "--output", choices=("table", "json"), default="table")
    plan.add_argument("--plot", metavar="PNG", help="draw throughput vs TPOT per candidate TP (the goodput chart)")

    predict = sub.add_parser("predict", help="predict one configuration's latency, throughput and memory")
    predict.add_argument("--model", required=True, help="catalog id, alias or Hugging Face repo id")
    predict.add_argument("--config-json", help="a Hugging Face config.json to use instead of the catalog")
    predict.add_argument("--gpu", required=True)
    predict.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    load = predict.add_mutually_exclusive_group()
    load.add_argument("--batch", type=int, help="static batch: this many requests started together "
                      "(vllm bench latency); the default, with 1")
    load.add_argument("--concurrency", type=int, help="closed loop: this many clients, each sending its next "
                      "request when one ends (vllm bench serve --max-concurrency)")
    load.add_argument("--request-rate", type=float, help="open loop: Poisson arrivals, requests/s "
                      "(vllm bench serve --request-rate)")
    predict.add_argument("--num-prompts", type=int, help="closed loop: the run's requests, every client starting at "
                         "once (vllm bench serve --num-prompts): the mean TTFT then counts the first wave's queue")
    predict.add_argument("--max-num-seqs", type=int, default=256, help="the engine's batch cap (closed and open loop)")
    predict.add_argument("--percentile", type=float, default=95.0, help="latency percentile reported beside the means")
    predict.add_argument("--input-tokens", type=int, default=1024)
    predict.add_argument("--output-tokens", type=int, default=256)
    predict.add_argument("--precision", choices=[p.value for p in Precision])
    predict.add_argument("--kv-cache-dtype", choices=[k.value for k in KvCacheDtype], default="auto")
    predict.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    predict.add_argument("-o", "--output", choices=("table", "json"), default="table")
    run = sub.add_parser("run", help="run the operator against the current kubeconfig")
    run.add_argument("-n", "--namespace", action="append", default=[],
                     help="watch only this namespace (repeatable); default: all namespaces")
    run.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
    run.add_argument("--scan-interval", type=float, default=30.0, help="seconds between full resyncs")
    run.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                     help="kopf liveness endpoint URL ('' to disable)")
    run.add_argument("--prometheus-url", help="Prometheus scraping the serving pods (enables autoscaling)")
    run.add_argument("--metrics-window", type=int, default=DEFAULT_WINDOW_S, metavar="SECONDS",
                     help="the rate window of the Prometheus queries (default %(default)s; keep it at 4 or more "
                     "scrape intervals of the serving pods)")
    run.add_argument("--gpu-price", action="append", default=[], metavar="TYPE=USD",
                     help="default hourly price of a GPU type (repeatable); a resource's own prices win")
    run.add_argument("--peering", help="kopf peering name: run several replicas, only one active")
    run.add_argument("--peering-lifetime", type=int, default=DEFAULT_PEERING_LIFETIME_S, metavar="SECONDS",
                     help="a replica silent for this long is dead and a standby takes over (with --peering)")
    run.add_argument("--metrics-port", type=int, help="serve the operator's own Prometheus metrics on this port")
    run.add_argument("--log-format", choices=("plain", "full", "json"), default="json")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    run.add_argument("-v", "--verbose", action="store_true", help="same as --log-level debug")
    simulate = sub.add_parser("simulate", help="replay a request trace against a simulated fleet and scaling policy")
    from kvscale.cli.simulate_cmd import add_simulate_arguments

    add_simulate_arguments(simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "plan":
            from kvscale.cli.plan_cmd import run_plan

            return run_plan(args)
        if args.command == "run":
            from kvscale.cli.run_cmd import run_operator_command

            return run_operator_command(args)
        if args.command == "predict":
            from kvscale.cli.predict_cmd import run_predict

            return run_predict(args)
        if args.command == "simulate":
            from kvscale.cli.simulate_cmd import run_simulate

            return run_simulate(args)
    except KvscaleError as exc:
        print(f"kvscale: error: {exc}", file=sys.stderr)
        return 2
    return 2

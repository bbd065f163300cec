"""`kvscale run`: the operator, with kopf's liveness endpoint and structured logs."""

from __future__ import annotations

import argparse
import logging
import os

import kopf

from kvscale.controllers.operator import OperatorConfig, run_operator
from kvscale.errors import InvalidSpecError


def parse_gpu_prices(items: list[str]) -> dict[str, float]:
    prices: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not name or price <= 0:
            raise InvalidSpecError(f"--gpu-price {item!r}: expected TYPE=USD with a positive price, e.g. H100-SXM=2.99")
        prices[name] = price
    return prices


def run_operator_command(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it too
    if args.scan_interval <= 0:
        raise InvalidSpecError("--scan-interval must be positive")
    level = "debug" if args.verbose else args.log_level
    kopf.configure(debug=level == "debug", verbose=level in ("debug", "info"),
                   log_format=kopf.LogFormat[args.log_format.upper()])
    logging.getLogger().setLevel(level.upper())
    config = OperatorConfig(
        namespaces=tuple(args.namespace),
        scan_interval_s=args.scan_interval,
        kubeconfig=args.kubeconfig,
        prometheus_url=args.prometheus_url,
        gpu_prices_usd_per_hour=parse_gpu_prices(args.gpu_price),
        peering=args.peering,
        metrics_port=args.metrics_port,
    )
    run_operator(config, args.liveness or None)
    return 0

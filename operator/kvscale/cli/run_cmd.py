"""`kvscale run`: the operator, with kopf's liveness endpoint and structured logs."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import re

import kopf

from kvscale.controllers.operator import OperatorConfig, run_operator
from kvscale.errors import InvalidSpecError
from kvscale.metrics.queries import MIN_WINDOW_S

# A namespace is a DNS-1123 label (the chart's values schema holds --namespace to the same rule).
NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
NAMESPACE_NAME_MAX = 63


def check_namespaces(names: list[str]) -> tuple[str, ...]:
    """The --namespace values, each a namespace's name. kopf would also take a pattern ('team-*') and watch
    what matches, but the resync loop and the chart's Roles address namespaces by name: a pattern would
    leave its resources planned once and never autoscaled, so it is refused here with what to pass."""
    for name in names:
        if len(name) > NAMESPACE_NAME_MAX or not NAMESPACE_NAME.match(name):
            raise InvalidSpecError(
                f"--namespace {name!r} is not a namespace name (lower-case letters, digits and '-', at most "
                f"{NAMESPACE_NAME_MAX}); patterns are not supported: pass each namespace, or none for all")
    return tuple(names)


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


# glibc gives every thread that allocates its own malloc arena (up to 8 per core); the operator's
# handler threads each churn through API bodies, so the arenas' free space inflates RSS. With 16
# handler threads, two arenas cut the peak RSS at 1,000 resources from 281 MiB to 206-213 MiB
# (benchmarks/operator_scale.py --count 1000; docs/operator.md).
MALLOC_ARENAS = 2
M_ARENA_MAX = -8  # glibc's mallopt parameter number


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas before any thread starts; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


def run_operator_command(args: argparse.Namespace) -> int:
    limit_malloc_arenas()
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it too
    if args.scan_interval <= 0:
        raise InvalidSpecError("--scan-interval must be positive")
    if args.metrics_window < MIN_WINDOW_S:
        raise InvalidSpecError(f"--metrics-window must be at least {MIN_WINDOW_S} seconds (a rate needs "
                               "several scrapes of each pod)")
    if args.peering_lifetime < 10:
        raise InvalidSpecError("--peering-lifetime must be at least 10 seconds (keep-alives come 5-10 s before it)")
    level = "debug" if args.verbose else args.log_level
    kopf.configure(debug=level == "debug", verbose=level in ("debug", "info"),
                   log_format=kopf.LogFormat[args.log_format.upper()])
    logging.getLogger().setLevel(level.upper())
    config = OperatorConfig(
        namespaces=check_namespaces(args.namespace),
        scan_interval_s=args.scan_interval,
        kubeconfig=args.kubeconfig,
        prometheus_url=args.prometheus_url,
        gpu_prices_usd_per_hour=parse_gpu_prices(args.gpu_price),
        peering=args.peering,
        peering_lifetime_s=args.peering_lifetime,
        metrics_port=args.metrics_port,
        metrics_window_s=args.metrics_window,
    )
    run_operator(config, args.liveness or None)
    return 0

"""`kvscale run`: the operator, with kopf's liveness endpoint and structured logs."""

from __future__ import annotations

import argparse
import os

import kopf

from kvscale.controllers.operator import OperatorConfig, run_operator


def run_operator_command(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it too
    if args.scan_interval <= 0:
        raise SystemExit("kvscale run: --scan-interval must be positive")
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    config = OperatorConfig(namespaces=tuple(args.namespace), scan_interval_s=args.scan_interval,
                            kubeconfig=args.kubeconfig)
    run_operator(config, args.liveness or None)
    return 0

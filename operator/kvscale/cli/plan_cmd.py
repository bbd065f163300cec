"""`kvscale plan -f FILE [-o json] [--plot out.png]`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvscale.cli.render import render_plan
from kvscale.cli.resource import load_resource_with_config
from kvscale.planner import build_plan_inputs, plan_deployment


def run_plan(args: argparse.Namespace) -> int:
    resource, config = load_resource_with_config(Path(args.file))
    plan = plan_deployment(build_plan_inputs(resource.spec, config))
    if args.output == "json":
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(render_plan(resource.metadata.name, plan))
    if args.plot:
        from kvscale.cli.charts import draw_goodput_chart

        draw_goodput_chart(plan, Path(args.plot))
        if args.output != "json":
            print(f"goodput chart written to {args.plot}")
    return 0 if plan.feasible else 1

"""`kvscale plan -f FILE [-o json] [--plot out.png]`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvscale.api.spec import load_resource
from kvscale.catalog import read_config_json
from kvscale.cli.render import render_plan
from kvscale.planner import build_plan_inputs, plan_deployment


def run_plan(args: argparse.Namespace) -> int:
    path = Path(args.file)
    resource = load_resource(path)
    config: dict[str, Any] | None = None
    if resource.spec.model.config_path:
        config_path = Path(resource.spec.model.config_path)
        if not config_path.is_absolute():
            config_path = path.parent / config_path
        config = read_config_json(config_path)
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

"""Seed means of one policy over simulated cases (docs/benchmarks.md, "Held-out traffic", 2026-11-26).

Run from the repository root:
    .venv/bin/python docs/experiments/burst_rules_seeds.py "autoscaling-code.yaml|azure-code|0.75;..." 1,2,3,4
Each case is resource (in benchmarks/data) | trace | speed-up; POLICY=static-peak for static-peak, TAG=x labels the rows.
"""
import sys, os
sys.path.insert(0, 'benchmarks')
from dataclasses import replace
from concurrent.futures import ProcessPoolExecutor
import collections
def one(job):
    resource, trace_name, speed, seed = job
    from autoscaling import CONFIG, DATA
    from kvscale.cli.simulate_cmd import load_deployment, load_trace, run_simulation
    dep = load_deployment(DATA / resource)
    trace = load_trace(trace_name).sped_up(speed)
    cfg = replace(CONFIG, seed=seed, server_form=replace(CONFIG.server_form, seed=seed))
    m = run_simulation(dep, trace, os.environ.get('POLICY', 'kvscale'), config=cfg).metrics
    return (resource, trace_name, speed), seed, 100*m['slo_attainment'], m['gpu_hours']
# args: "resource|trace|speed;..." seeds
cases = [tuple(c.split("|")) for c in sys.argv[1].split(";")]
cases = [(r, t, float(s)) for r, t, s in cases]
seeds = [int(x) for x in sys.argv[2].split(",")]
jobs = [(*c, s) for c in cases for s in seeds]
acc = collections.defaultdict(list)
with ProcessPoolExecutor(2) as ex:
    for key, seed, a, g in ex.map(one, jobs):
        acc[key].append((a, g))
tag = os.environ.get("TAG", "")
for c in cases:
    v = acc[c]
    print(f"{tag:8s} {c[0]:28s} {c[1][:40]:40s} x{c[2]:g} att {sum(a for a,_ in v)/len(v):6.2f}% gpuh {sum(g for _,g in v)/len(v):7.2f}  " + " ".join(f"{a:.2f}/{g:.1f}" for a, g in v), flush=True)

"""Operator at scale: apply N LLMDeployments to the test bed, time convergence, read peak memory.

    make testbed-up && .venv/bin/python benchmarks/operator_scale.py [--count 200]

Runs `kvscale run` as a real process (its peak RSS is /proc/PID/status VmHWM) watching one fresh
namespace, applies N resources cycling through the examples in one `kubectl apply`, and waits until
every one has a Planned condition and an owned Deployment. Prints the figures and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".testbed"
KUBECTL = Path.home() / ".cache" / "kvscale" / "testbed" / "bin" / "kubectl"


def kubectl(*args: str, stdin: str | None = None) -> str:
    result = subprocess.run([str(KUBECTL), f"--kubeconfig={STATE / 'kubeconfig'}", *args], input=stdin,
                            capture_output=True, text=True, check=True, timeout=600)
    return result.stdout


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def converged(namespace: str, count: int) -> int:
    items = json.loads(kubectl("get", "llmd", "-n", namespace, "-o", "json"))["items"]
    planned = sum(1 for i in items for c in (i.get("status") or {}).get("conditions") or []
                  if c["type"] == "Planned" and c["status"] == "True")
    deployments = len(json.loads(kubectl("get", "deployments", "-n", namespace, "-o", "json"))["items"])
    return min(planned, deployments)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--timeout-s", type=float, default=900)
    args = parser.parse_args()
    if not (STATE / "kubeconfig").is_file():
        print("the test bed is not up: run `make testbed-up` first", file=sys.stderr)
        return 2
    namespace = f"scale-{uuid.uuid4().hex[:6]}"
    kubectl("apply", "-f", str(ROOT / "crds"))
    kubectl("create", "namespace", namespace)
    examples = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "examples").glob("*.yaml"))]
    documents = []
    for i in range(args.count):
        doc = json.loads(json.dumps(examples[i % len(examples)]))
        doc["metadata"] = {"name": f"{doc['metadata']['name']}-{i}", "namespace": namespace}
        documents.append(doc)
    log = open(ROOT / ".testbed" / "logs" / f"operator-scale-{namespace}.log", "w")  # noqa: SIM115
    env = {**os.environ, "KUBECONFIG": str(STATE / "kubeconfig")}
    operator = subprocess.Popen([str(ROOT / ".venv/bin/kvscale"), "run", "-n", namespace, "--liveness", "",
                                 "--scan-interval", "60", "--log-format", "plain", "--log-level", "warning"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        start = time.monotonic()
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))
        applied = time.monotonic() - start
        done, deadline = 0, start + args.timeout_s
        while done < args.count and time.monotonic() < deadline:
            done = converged(namespace, args.count)
            if operator.poll() is not None:
                raise SystemExit(f"the operator exited with {operator.returncode}; see {log.name}")
            time.sleep(1.0)  # polling interval of this measurement loop
        elapsed = time.monotonic() - start
        rss = peak_rss_mib(operator.pid)
        print(f"operator scale (command: .venv/bin/python benchmarks/operator_scale.py --count {args.count})")
        print(f"  resources applied: {args.count} (kubectl apply took {applied:.1f} s)")
        print(f"  converged (Planned + Deployment): {done}/{args.count} in {elapsed:.1f} s "
              f"({done / elapsed:.1f} resources/s)")
        print(f"  operator peak memory (VmHWM): {rss:.0f} MiB")
    finally:
        stop_start = time.monotonic()
        operator.terminate()
        try:
            operator.wait(timeout=60)
            print(f"  operator stopped {time.monotonic() - stop_start:.1f} s after SIGTERM")
        except subprocess.TimeoutExpired:
            operator.kill()
            print("  operator did not stop within 60 s of SIGTERM; killed")
        kubectl("delete", "namespace", namespace, "--wait=false")
    return 0 if done == args.count else 1


if __name__ == "__main__":
    sys.exit(main())

"""Operator at scale: apply N LLMDeployments to the test bed, time convergence, read peak memory.

    make testbed-up && .venv/bin/python benchmarks/operator_scale.py [--count 1000]

Runs `kvscale run` as a real process (its peak RSS is /proc/PID/status VmHWM, sampled each second
as well to show when it peaks) watching one fresh namespace, applies N resources cycling through the
examples in one `kubectl apply`, and waits until every one has a Planned condition, its Deployment
and its Service. Prints the figures, the operator's own counts (passes, writes) and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".testbed"
EXTRA_ENV = dict(item.split("=", 1) for item in os.environ.get("SCALE_EXTRA_ENV", "").split() if "=" in item)
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


def count_lines(*args: str) -> int:
    return sum(1 for line in kubectl(*args).splitlines() if line.strip())


def converged(namespace: str) -> int:
    """Resources with Planned=True, a Deployment and a Service (names only: cheap on a busy bed)."""
    planned = kubectl("get", "llmd", "-n", namespace, "-o",
                      'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Planned")].status}{"\\n"}{end}')
    done = sum(1 for line in planned.splitlines() if line.strip() == "True")
    deployments = count_lines("get", "deployments", "-n", namespace, "-o", "name")
    services = count_lines("get", "services", "-n", namespace, "-o", "name")
    return min(done, deployments, services)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def probe(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        found: dict[str, Any] = json.loads(resp.read())["reconciles"]
        return found


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
    env = {**os.environ, "KUBECONFIG": str(STATE / "kubeconfig"), **EXTRA_ENV}
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    operator = subprocess.Popen([str(ROOT / ".venv/bin/kvscale"), "run", "-n", namespace, "--liveness", liveness,
                                 "--scan-interval", "60", "--log-format", "plain", "--log-level", "warning"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: probe(liveness), 60)
        idle = rss_mib(operator.pid)
        start = time.monotonic()
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))
        applied = time.monotonic() - start
        done, deadline, samples = 0, start + args.timeout_s, []
        while done < args.count and time.monotonic() < deadline:
            done = converged(namespace)
            samples.append((time.monotonic() - start, rss_mib(operator.pid), done))
            if operator.poll() is not None:
                raise SystemExit(f"the operator exited with {operator.returncode}; see {log.name}")
            time.sleep(1.0)  # polling interval of this measurement loop
        elapsed = time.monotonic() - start
        rss = peak_rss_mib(operator.pid)
        counts = probe(liveness)
        print(f"operator scale (command: .venv/bin/python benchmarks/operator_scale.py --count {args.count})")
        print(f"  resources applied: {args.count} (kubectl apply took {applied:.1f} s)")
        print(f"  converged (Planned + Deployment + Service): {done}/{args.count} in {elapsed:.1f} s "
              f"({done / elapsed:.1f} resources/s)")
        print(f"  operator peak memory (VmHWM): {rss:.0f} MiB (idle before the apply: {idle:.0f} MiB)")
        print("  RSS over time (s, MiB, converged): "
              + ", ".join(f"{t:.0f}/{m:.0f}/{d}" for t, m, d in samples[:: max(1, len(samples) // 12)]))
        print(f"  operator's own counts: {counts['reconciles']} reconciles, {counts['writes']} writes "
              f"({counts['writes'] / max(args.count, 1):.1f} per resource), {counts['failures']} failed passes")
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


def wait_for(check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the operator's liveness endpoint did not answer")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


if __name__ == "__main__":
    sys.exit(main())

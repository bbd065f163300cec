"""`make demo`: kvscale autoscaling a (simulated) Llama-3.1-8B fleet through a load surge, on the local test bed.

What runs, all on this machine and on loopback:

1. the test bed (tests/testbed/up.sh: kube-apiserver, controllers, scheduler, kwok fake GPU nodes and
   Prometheus), started when it is not already up, and stopped at the end only if this demo started it;
2. the operator as a subprocess, `kvscale run --prometheus-url ... -n <demo namespace> --scan-interval 5
   --metrics-window 30 --log-format plain`, logging to demo-out/operator.log;
3. podsim (tests/e2e/podsim.py): one llm-d-inference-sim per Running serving pod, with the published
   8b-h100-balanced latency profile, scraped by Prometheus as the pod's target;
4. demo/llama-3.1-8b-h100.yaml applied, then the Azure conversation trace (demo/traces, CC-BY 4.0,
   Patel et al., "Splitwise", ISCA 2024) replayed 15x faster as real streaming /v1/completions requests
   (tests/e2e/loadgen.py), sub-sampled to ~3 req/s with a 4x surge in the middle.

Every 5 s it prints: time, offered and completed requests/s, replicas desired/ready, the p95 TTFT and TPOT
Prometheus sees (vs the SLO), GPUs and cost per hour, and each new scaling decision with its reason. It
ends by itself (about five minutes), prints a summary, and writes demo-out/summary.json,
demo-out/timeline.json, demo-out/requests.json and demo-out/demo.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests" / "testbed")]

import yaml  # noqa: E402
from bedctl import BedUnavailableError, bed_healthy, connect_kube, connect_prometheus  # noqa: E402
from bedkit import Kube, Prometheus, free_port, wait_until  # noqa: E402
from loadgen import (  # noqa: E402
    LoadGenerator,
    LoadReport,
    Surge,
    find_trace,
    rate_scale_for,
    read_trace,
    replay_schedule,
    schedule_rate,
)
from podsim import PodSim  # noqa: E402

RESOURCE = ROOT / "demo" / "llama-3.1-8b-h100.yaml"
CRD = ROOT / "crds" / "llmdeployments.kvscale.dev.yaml"
TABLE_EVERY_S = 5.0


@dataclass
class Row:
    t: float  # seconds since the load started
    offered_rps: float
    completed_rps: float
    failed_rps: float
    in_flight: int
    desired: int
    ready: int
    pods: int
    gpus: int
    cost_per_hour: float
    prom_ttft_p95_s: float | None
    prom_tpot_p95_s: float | None
    client_ttft_p95_s: float | None
    client_tpot_p95_s: float | None


def log(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- the bed and the operator ------------------------------------------------------------------------


def ensure_bed() -> bool:
    """Start the bed unless it is up; True when this demo started it (and so must stop it)."""
    if bed_healthy():
        log("the test bed is already up: using it (it stays up afterwards)")
        return False
    log("starting the test bed (tests/testbed/up.sh; binaries are cached by `make testbed-build`)")
    subprocess.run(["bash", str(ROOT / "tests" / "testbed" / "up.sh")], check=True, cwd=ROOT)
    return True


def install_crd(kube: Kube) -> None:
    kube.kubectl("apply", "-f", str(CRD), check=True)
    kube.kubectl("wait", "--for=condition=Established", "crd/llmdeployments.kvscale.dev", "--timeout=60s",
                 check=True)


def create_namespace(kube: Kube) -> str:
    name = f"kvscale-demo-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", name, check=True)
    wait_until(lambda: kube.kubectl("get", "serviceaccount", "default", "-n", name).returncode == 0, 60,
               f"serviceaccount {name}/default")
    return name


def start_operator(kube: Kube, prometheus_url: str, namespace: str, log_path: Path, metrics_window_s: int,
                   ) -> subprocess.Popen[bytes]:
    kvscale = Path(sys.executable).parent / "kvscale"
    command = [str(kvscale)] if kvscale.exists() else [sys.executable, "-m", "kvscale"]
    command += ["run", "--prometheus-url", prometheus_url, "-n", namespace, "--scan-interval", "5",
                "--metrics-window", str(metrics_window_s),
                "--log-format", "plain", "--kubeconfig", str(kube.kubeconfig),
                "--liveness", f"http://127.0.0.1:{free_port()}/healthz"]
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    # Worked out before the operator starts: nothing between its start and its return may fail, or it outlives
    # the demo (the caller stops only what was returned; --out may lie outside the repository).
    shown = log_path.relative_to(ROOT) if log_path.is_relative_to(ROOT) else log_path
    with log_path.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=ROOT, start_new_session=True)
    log(f"operator started (pid {proc.pid}): {' '.join(command[1:])}; log {shown}")
    return proc


def stop_process(proc: subprocess.Popen[bytes], name: str, grace_s: float = 15) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)  # kopf stops gracefully on SIGINT/SIGTERM
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        log(f"{name} did not stop in {grace_s:.0f} s: killing it")
        proc.kill()
        proc.wait(10)


# --- what the table shows ----------------------------------------------------------------------------


def prom_p95(prometheus: Prometheus, metric: str, namespace: str, name: str, window: str = "30s") -> float | None:
    promql = (f'histogram_quantile(0.95, sum by (le) (rate({metric}_bucket{{namespace="{namespace}", '
              f'llmdeployment="{name}"}}[{window}])))')
    try:
        rows = prometheus.query(promql)
    except Exception:
        return None
    value = float(rows[0]["value"][1]) if rows else math.nan
    return None if math.isnan(value) else value


def fmt_ms(value: float | None, slo_s: float) -> str:
    if value is None:
        return "     -"
    return f"{value * 1000:6.0f}{'!' if value > slo_s else ' '}"


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = ROOT / args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.document = yaml.safe_load(RESOURCE.read_text())
        self.name = self.document["metadata"]["name"]
        spec = self.document["spec"]
        self.model = spec["model"]["name"]
        self.ttft_slo_s = spec["slo"]["ttftMs"] / 1000.0
        self.tpot_slo_s = spec["slo"]["tpotMs"] / 1000.0
        self.rows: list[Row] = []
        self.decisions: list[dict[str, Any]] = []

    def llmd(self, kube: Kube, namespace: str) -> dict[str, Any]:
        obj: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            "kvscale.dev", "v1alpha1", namespace, "llmdeployments", self.name)
        return obj

    def sample(self, kube: Kube, prometheus: Prometheus, namespace: str, load: LoadGenerator,
               schedule_rps: float) -> Row:
        deployment = kube.apps.read_namespaced_deployment(self.name, namespace)
        status = self.llmd(kube, namespace).get("status") or {}
        plan = status.get("plan") or {}
        tp = int(plan.get("tensorParallel") or 1)
        per_gpu = float(plan["costPerHour"]) / max(int(plan.get("gpus") or 1), 1) if plan.get("costPerHour") else 0.0
        pods = int(deployment.status.replicas or 0)
        recent = load.recent(TABLE_EVERY_S)
        decision = status.get("lastScaleDecision")
        if decision and (not self.decisions or self.decisions[-1]["time"] != decision.get("time")):
            calibration = status.get("calibration") or {}
            self.decisions.append({**decision, "demo_t": recent["t_s"], "calibration": calibration})
            print(f"      -> {decision.get('reason', '')[:240]}", flush=True)
            if calibration:  # what the goodput in the reason was computed with
                print(f"         calibration: decode x{calibration.get('decodeFactor')}, prefill "
                      f"x{calibration.get('prefillFactor')}, tails TTFT x{calibration.get('ttftTailFactor')} "
                      f"TPOT x{calibration.get('tpotTailFactor')}, {calibration.get('fittedWindows')} windows",
                      flush=True)
        return Row(
            t=recent["t_s"], offered_rps=schedule_rps, completed_rps=recent["completed_per_s"],
            failed_rps=recent["failed_per_s"], in_flight=recent["in_flight"],
            desired=int(deployment.spec.replicas or 0), ready=int(deployment.status.ready_replicas or 0), pods=pods,
            gpus=pods * tp, cost_per_hour=pods * tp * per_gpu,
            prom_ttft_p95_s=prom_p95(prometheus, "vllm:time_to_first_token_seconds", namespace, self.name),
            prom_tpot_p95_s=prom_p95(prometheus, "vllm:inter_token_latency_seconds", namespace, self.name),
            client_ttft_p95_s=recent["ttft_p95_s"], client_tpot_p95_s=recent["tpot_p95_s"])

    def print_header(self) -> None:
        print(f"\n{'':28}{'p95 TTFT, ms':>15} {'p95 TPOT, ms':>15}\n"
              f"{'time':>5} {'req/s':>6} {'done/s':>6} {'repl':>4} {'ready':>5}  {'Prom':>7} {'client':>7} "
              f"{'Prom':>7} {'client':>7} {'GPUs':>4} {'$/h':>6}   (SLO {self.ttft_slo_s * 1000:.0f} / "
              f"{self.tpot_slo_s * 1000:.0f} ms; ! = over; req/s offered by the trace, done/s completed)", flush=True)

    def print_row(self, row: Row) -> None:
        ttft, tpot = self.ttft_slo_s, self.tpot_slo_s
        print(f"{row.t:5.0f} {row.offered_rps:6.1f} {row.completed_rps:6.1f} {row.desired:4d} {row.ready:5d}  "
              f"{fmt_ms(row.prom_ttft_p95_s, ttft):>7} {fmt_ms(row.client_ttft_p95_s, ttft):>7} "
              f"{fmt_ms(row.prom_tpot_p95_s, tpot):>7} {fmt_ms(row.client_tpot_p95_s, tpot):>7} "
              f"{row.gpus:4d} {row.cost_per_hour:6.2f}", flush=True)

    # --- the run -------------------------------------------------------------------------------------
    def run(self) -> int:
        args = self.args
        t_start = time.monotonic()
        started_bed = ensure_bed()
        kube: Kube | None = None
        namespace: str | None = None
        operator: subprocess.Popen[bytes] | None = None
        sims: PodSim | None = None
        load: LoadGenerator | None = None
        try:
            kube, prometheus = connect_kube(), connect_prometheus()
            install_crd(kube)
            namespace = create_namespace(kube)
            log(f"namespace {namespace}; Prometheus {prometheus.url}")
            operator = start_operator(kube, prometheus.url, namespace, self.out / "operator.log",
                                      args.metrics_window)
            sims = PodSim(kube, prometheus, [namespace]).start()
            result = kube.kubectl("apply", "-n", namespace, "-f", str(RESOURCE), check=True)
            log(result.stdout.strip() + f" ({RESOURCE.relative_to(ROOT)})")
            replicas = wait_until(lambda: self._deployment_replicas(kube, namespace), 120,
                                  "the operator's Deployment")
            for endpoint in sims.wait_for(self.name, replicas, timeout=120, namespace=namespace):
                prometheus.wait_for_target_up(endpoint, timeout=60)
            plan = (self.llmd(kube, namespace).get("status") or {}).get("plan") or {}
            log(f"planned {plan.get('replicas')} x TP{plan.get('tensorParallel')} {plan.get('gpuType')}, "
                f"max-num-seqs {plan.get('maxNumSeqs')}, ${plan.get('costPerHour')}/h; "
                f"{replicas} simulator(s) up and scraped: {', '.join(s.config.profile.name for s in sims.simulators())}"
                " latency profile")

            trace = read_trace(find_trace())
            schedule = replay_schedule(
                trace, time_scale=args.time_scale,
                rate_scale=rate_scale_for(trace, args.time_scale, args.base_rps, duration_s=args.duration),
                surge=Surge(args.surge, args.surge_start, args.surge_end), duration_s=args.duration,
                max_context_tokens=int(plan.get("maxModelLen") or 8192), seed=args.seed)
            log(f"replaying {find_trace().name}: {len(schedule)} requests over {args.duration:.0f} s "
                f"({args.time_scale:g}x faster, ~{args.base_rps:g} req/s, {args.surge:g}x surge from "
                f"{args.surge_start:.0f} s to {args.surge_end:.0f} s)")
            load = LoadGenerator(schedule, lambda: sims.endpoints(self.name, namespace) if sims else [], self.model,
                                 max_duration_s=args.duration, max_in_flight=400, drain_timeout_s=45,
                                 seed=args.seed).start()
            self.print_header()
            next_at, failures = TABLE_EVERY_S, 0
            while load.running:
                time.sleep(max(0.0, next_at - load.elapsed()))
                next_at += TABLE_EVERY_S
                try:
                    row = self.sample(kube, prometheus, namespace, load,
                                      schedule_rate(schedule, load.elapsed() - TABLE_EVERY_S / 2, TABLE_EVERY_S))
                except Exception as exc:  # an API blip must not end the demo...
                    failures += 1
                    log(f"(could not sample: {type(exc).__name__}: {str(exc)[:100]})")
                    if failures * TABLE_EVERY_S >= 20 and not bed_healthy():  # ...but a bed that went away does
                        log("the test bed stopped answering (stopped by someone else?): ending the load early")
                        load.stop()
                    continue
                failures = 0
                self.rows.append(row)
                self.print_row(row)
            report = load.report()
            summary = self.summarize(report, plan, namespace, time.monotonic() - t_start)
            self.write(report, summary)
            self.print_summary(summary)
            return 0 if summary["requests_completed"] > 0 else 1
        finally:
            log("cleaning up: load, simulators, operator, namespace" + (", test bed" if started_bed else ""))
            if load is not None:
                load.stop()
            if sims is not None:
                sims.close()
            if operator is not None:
                stop_process(operator, "the operator")
            if kube is not None and namespace is not None:
                kube.kubectl("delete", "namespace", namespace, "--wait=false")
            if started_bed:
                subprocess.run(["bash", str(ROOT / "tests" / "testbed" / "down.sh")], check=False, cwd=ROOT)

    def _deployment_replicas(self, kube: Kube, namespace: str) -> int | None:
        try:
            d = kube.apps.read_namespaced_deployment(self.name, namespace)
        except Exception:
            return None
        return int(d.spec.replicas) if d.spec.replicas else None

    # --- results -------------------------------------------------------------------------------------
    def summarize(self, report: LoadReport, plan: dict[str, Any], namespace: str, wall_s: float) -> dict[str, Any]:
        load = report.summary(self.ttft_slo_s, self.tpot_slo_s)
        rows = self.rows
        gpu_hours = sum(r.gpus * TABLE_EVERY_S for r in rows) / 3600.0
        cost = sum(r.cost_per_hour * TABLE_EVERY_S for r in rows) / 3600.0
        peak_gpus = max((r.gpus for r in rows), default=0)
        return {
            "resource": str(RESOURCE.relative_to(ROOT)),
            "namespace": namespace,
            "trace": find_trace().name,
            "load": {"duration_s": self.args.duration, "time_scale": self.args.time_scale,
                     "base_rps": self.args.base_rps, "surge_factor": self.args.surge,
                     "surge_window_s": [self.args.surge_start, self.args.surge_end]},
            "slo": {"ttft_ms": self.ttft_slo_s * 1000, "tpot_ms": self.tpot_slo_s * 1000, "percentile": 95},
            "plan": {k: plan.get(k) for k in ("gpuType", "tensorParallel", "maxNumSeqs", "replicas", "costPerHour")},
            "min_replicas": min((r.desired for r in rows), default=None),
            "max_replicas": max((r.desired for r in rows), default=None),
            "scale_decisions": len(self.decisions),
            "slo_attainment": load["slo_attainment"],
            "ttft_p95_ms": None if load["ttft_p95_s"] is None else round(load["ttft_p95_s"] * 1000, 1),
            "tpot_p95_ms": None if load["tpot_p95_s"] is None else round(load["tpot_p95_s"] * 1000, 2),
            "gpu_hours": round(gpu_hours, 4),
            "gpu_hours_at_peak_static": round(peak_gpus * len(rows) * TABLE_EVERY_S / 3600.0, 4),
            "cost_usd": round(cost, 4),
            "requests_sent": load["requests_sent"],
            "requests_completed": load["requests_completed"],
            "requests_failed": load["requests_failed"],
            "errors": load["errors"],
            "wall_clock_s": round(wall_s, 1),
            "attribution": "Azure LLM inference trace 2023 (conversation), Patel et al., Splitwise, ISCA 2024, "
                           "CC-BY 4.0",
        }

    def write(self, report: LoadReport, summary: dict[str, Any]) -> None:
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (self.out / "timeline.json").write_text(json.dumps(
            {"rows": [asdict(r) for r in self.rows], "decisions": self.decisions}, indent=1) + "\n")
        (self.out / "requests.json").write_text(json.dumps(report.to_json()) + "\n")
        self.plot(report)

    def plot(self, report: LoadReport) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.rows
        t = [r.t for r in rows]
        fig, (ax_load, ax_repl, ax_lat) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
        ax_load.plot(t, [r.offered_rps for r in rows], label="offered (trace replay)", color="tab:gray")
        ax_load.plot(t, [r.completed_rps for r in rows], label="completed", color="tab:blue")
        ax_load.set_ylabel("requests/s")
        ax_load.legend(loc="upper right")
        ax_load.set_title(f"kvscale demo: {self.model} on H100 (simulated), conversation trace "
                          f"{self.args.time_scale:g}x, {self.args.surge:g}x surge")
        ax_repl.step(t, [r.desired for r in rows], where="post", label="desired (Deployment)", color="tab:orange")
        ax_repl.step(t, [r.ready for r in rows], where="post", label="ready", color="tab:green", linestyle="--")
        ax_repl.set_ylabel("replicas")
        ax_repl.legend(loc="upper right")
        ok = [r for r in report.results if r.ok and r.done_s is not None]
        ax_lat.scatter([r.done_s for r in ok], [(r.ttft_s or 0) * 1000 for r in ok], s=3, alpha=0.25,
                       color="tab:purple", label="TTFT per request (client)")
        ax_lat.plot(t, [(r.prom_ttft_p95_s or math.nan) * 1000 for r in rows], color="tab:purple",
                    label="p95 TTFT (Prometheus)")
        ax_lat.axhline(self.ttft_slo_s * 1000, color="tab:purple", linestyle=":", label="TTFT SLO")
        ax_lat.set_ylabel("TTFT, ms")
        ax_lat.set_yscale("log")
        ax_tpot = ax_lat.twinx()
        ax_tpot.plot(t, [(r.prom_tpot_p95_s or math.nan) * 1000 for r in rows], color="tab:red",
                     label="p95 TPOT (Prometheus)")
        ax_tpot.axhline(self.tpot_slo_s * 1000, color="tab:red", linestyle=":", label="TPOT SLO")
        ax_tpot.set_ylabel("TPOT, ms")
        lines = ax_lat.get_legend_handles_labels()
        more = ax_tpot.get_legend_handles_labels()
        ax_lat.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right", fontsize="x-small", ncol=2)
        ax_lat.set_xlabel("seconds since the load started")
        fig.tight_layout()
        fig.savefig(self.out / "demo.png", dpi=110)
        plt.close(fig)

    def print_summary(self, s: dict[str, Any]) -> None:
        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v * 100:.1f}%"

        print(f"""
SUMMARY ({s['wall_clock_s']:.0f} s wall clock; details in {self.args.out}/summary.json, plot {self.args.out}/demo.png)
  requests        {s['requests_completed']} completed, {s['requests_failed']} failed of {s['requests_sent']} sent
  replicas        min {s['min_replicas']}, max {s['max_replicas']} (plan: {s['plan']['replicas']}); \
{s['scale_decisions']} scaling decision(s)
  SLO attainment  {pct(s['slo_attainment'])} of requests met TTFT <= {s['slo']['ttft_ms']:.0f} ms and \
TPOT <= {s['slo']['tpot_ms']:.0f} ms (client-side)
  p95             TTFT {s['ttft_p95_ms']} ms, TPOT {s['tpot_p95_ms']} ms (client-side)
  GPU-hours       {s['gpu_hours']:.3f} (static at peak: {s['gpu_hours_at_peak_static']:.3f}); cost ${s['cost_usd']:.3f}
  trace           {s['attribution']}""", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=230.0, help="seconds of load (default 230: the whole trace)")
    p.add_argument("--time-scale", type=float, default=15.0, help="trace seconds per real second")
    p.add_argument("--base-rps", type=float, default=3.0, help="mean request rate outside the surge")
    p.add_argument("--surge", type=float, default=4.0, help="rate multiplier during the surge")
    p.add_argument("--surge-start", type=float, default=40.0)
    p.add_argument("--surge-end", type=float, default=100.0)
    p.add_argument("--seed", type=int, default=1)
    # The trace plays 15x faster and Prometheus scrapes every 2 s; the scale-down window and pace are compressed
    # 5x (the resource). A 60 s rate window kept the surge in the demand for a minute after it ended.
    p.add_argument("--metrics-window", type=int, default=30,
                   help="the operator's Prometheus rate window, seconds (kvscale run --metrics-window)")
    p.add_argument("--out", default="demo-out")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        return Demo(parse_args(argv)).run()
    except BedUnavailableError as exc:
        log(f"the test bed is not usable: {exc} (try `make testbed-up`)")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())

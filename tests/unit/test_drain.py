"""Graceful scale-down, pure parts: the grace period from the longest request, the preStop drain script
(run for real against a local /metrics), and the pod-deletion costs written before a scale-down."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvscale.api.spec import Engine, LLMDeploymentSpec, load_resource
from kvscale.kube import Owner, build_deployment
from kvscale.kube.drain import (
    DELETION_COST_ANNOTATION,
    ENGINE_SHUTDOWN_S,
    MAX_GRACE_S,
    MIN_GRACE_S,
    DeletionCost,
    deletion_costs,
    drain_lifecycle,
    drain_script,
    longest_output_tokens,
    longest_request_s,
    termination_grace_s,
)
from kvscale.planner import build_plan_inputs, plan_deployment

ROOT = Path(__file__).resolve().parents[2]
SELECTOR = {"kvscale.dev/llmdeployment": "chat"}


@pytest.fixture(scope="module")
def spec() -> LLMDeploymentSpec:
    return load_resource(ROOT / "examples" / "llama-3.1-70b-h100.yaml").spec


def changed(spec: LLMDeploymentSpec, section: str, **fields: Any) -> LLMDeploymentSpec:
    document = spec.model_dump(by_alias=True, exclude_none=True)
    document[section] = {**document[section], **fields}
    return LLMDeploymentSpec.model_validate(document)


# --- how long the longest request takes, and the grace period ---------------------------------------------

def test_the_longest_output_is_the_geometric_tail_or_a_longer_stated_percentile(spec: LLMDeploymentSpec) -> None:
    mean = spec.workload.output_tokens
    # P(length > n) = (1 - 1/mean)^n is 0.001 at about mean * ln(1000): 6.9 means
    assert longest_output_tokens(spec, 1_000_000) == math.ceil(mean * math.log(1000))
    heavy = changed(spec, "workload", outputTokensPercentiles={"p50": mean, "p99": 40 * mean})
    assert longest_output_tokens(heavy, 1_000_000) == 40 * mean
    assert longest_output_tokens(heavy, 2048) == 2047  # a request never outgrows the context


def test_the_longest_request_runs_at_the_slo_bounds_or_a_worse_prediction(spec: LLMDeploymentSpec) -> None:
    tokens = longest_output_tokens(spec, 8192)
    at_slo = longest_request_s(spec, 8192, None, None)
    assert at_slo == pytest.approx((spec.slo.ttft_ms + (tokens - 1) * spec.slo.tpot_ms) / 1000)
    assert longest_request_s(spec, 8192, spec.slo.ttft_ms / 2, spec.slo.tpot_ms / 2) == at_slo
    assert longest_request_s(spec, 8192, None, 2 * spec.slo.tpot_ms) > 1.9 * at_slo - spec.slo.ttft_ms / 1000


def test_the_grace_period_covers_the_request_and_the_shutdown_within_bounds() -> None:
    assert termination_grace_s(1.0) == MIN_GRACE_S
    assert termination_grace_s(100.2) >= 100.2 + ENGINE_SHUTDOWN_S
    assert termination_grace_s(1e6) == MAX_GRACE_S


def test_the_pod_template_waits_for_its_longest_request(spec: LLMDeploymentSpec) -> None:
    inputs = build_plan_inputs(spec)
    plan = plan_deployment(inputs)
    assert plan.chosen is not None and plan.chosen.predicted is not None
    built = build_deployment(Owner("llama-70b", "serving", "uid-1"), spec, plan.chosen, 2,
                             gpu=next(g for g in inputs.gpus if g.name == plan.chosen.gpu_type),
                             native_precision=inputs.arch.native_precision)
    pod = built["spec"]["template"]["spec"]
    longest = longest_request_s(spec, plan.chosen.max_model_len, plan.chosen.predicted.ttft_ms,
                                plan.chosen.predicted.tpot_ms)
    assert pod["terminationGracePeriodSeconds"] >= longest + ENGINE_SHUTDOWN_S
    command = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "-c"] and "vllm:num_requests_running" in command[2]
    compile(command[2], "preStop", "exec")  # valid Python


# --- the preStop script, run ---------------------------------------------------------------------------

class _Metrics:
    """A /metrics endpoint whose busy gauges the test sets."""

    def __init__(self, engine: Engine) -> None:
        self.running = 0.0
        self.engine = engine
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if metrics.engine == Engine.VLLM:
                    text = (f'vllm:num_requests_running{{engine="0",model_name="m"}} {metrics.running}\n'
                            'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
                            'vllm:num_requests_running_total 99\n')  # another name that must not count
                else:  # SGLang: one series per TP rank
                    text = "".join(f'sglang:num_running_reqs{{tp_rank="{r}"}} {metrics.running}\n'
                                   f'sglang:num_queue_reqs{{tp_rank="{r}"}} 0\n' for r in range(2))
                body = f"# HELP x\n{text}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


@pytest.fixture(params=[Engine.VLLM, Engine.SGLANG])
def metrics(request: pytest.FixtureRequest) -> Iterator[_Metrics]:
    served = _Metrics(request.param)
    yield served
    served.server.shutdown()


def run_hook(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", script])


def test_the_hook_waits_while_requests_run_and_returns_once_they_are_done(metrics: _Metrics) -> None:
    metrics.running = 3.0
    hook = run_hook(drain_script(metrics.engine, metrics.port, "/metrics", budget_s=60, settle_s=0))
    with pytest.raises(subprocess.TimeoutExpired):
        hook.wait(timeout=2.5)  # still serving: the hook holds SIGTERM back
    metrics.running = 0.0
    assert hook.wait(timeout=10) == 0


def test_the_hook_gives_up_at_its_budget_or_when_the_engine_is_gone(metrics: _Metrics) -> None:
    metrics.running = 1.0
    started = time.monotonic()
    assert run_hook(drain_script(metrics.engine, metrics.port, "/metrics", budget_s=2, settle_s=0)).wait(20) == 0
    assert 1.5 < time.monotonic() - started < 15
    metrics.server.shutdown()
    metrics.server.server_close()
    started = time.monotonic()
    assert run_hook(drain_script(metrics.engine, metrics.port, "/metrics", budget_s=60, settle_s=0)).wait(20) == 0
    assert time.monotonic() - started < 10


def test_the_hook_budget_leaves_time_for_the_shutdown() -> None:
    script = drain_lifecycle(Engine.VLLM, 8000, "/metrics", 120)["preStop"]["exec"]["command"][2]
    assert "deadline = time.monotonic() + 100" in script  # 120 - 15 shutdown - 5 propagation


# --- which pods a scale-down removes -------------------------------------------------------------------

def pod(name: str, cost: str | None = None, labels: dict[str, str] | None = None,
        terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": SELECTOR if labels is None else labels}
    if cost is not None:
        meta["annotations"] = {DELETION_COST_ANNOTATION: cost}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-24T10:00:00Z"
    return {"metadata": meta}


def test_costs_are_the_requests_in_flight_in_tenths() -> None:
    pods = [pod("busy"), pod("light"), pod("idle"), pod("unscraped")]
    loads = {"busy": 12.0, "light": 0.34, "idle": 0.0}
    assert deletion_costs(pods, SELECTOR, loads) == [DeletionCost("busy", 120), DeletionCost("idle", 0),
                                                     DeletionCost("light", 3), DeletionCost("unscraped", 0)]


def test_costs_skip_other_deployments_terminating_pods_and_unchanged_annotations() -> None:
    pods = [pod("other", labels={"kvscale.dev/llmdeployment": "code"}), pod("leaving", terminating=True),
            pod("same", cost="50"), pod("moved", cost="50")]
    loads = {"other": 9.0, "leaving": 9.0, "same": 5.0, "moved": math.inf}
    assert deletion_costs(pods, SELECTOR, loads) == [DeletionCost("moved", 0)]

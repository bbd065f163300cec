"""Helpers for tests that run on the real test bed (tests/testbed/up.sh).

Imported by tests/conftest.py (which puts this folder on sys.path) and by bed tests:
`from bedkit import Kube, wait_until`. Only the standard library is imported at module level;
the kubernetes client is imported when a `Kube` is used.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
STATE_DIR = REPO_ROOT / ".testbed"
CACHE_DIR = Path(os.environ.get("KVSCALE_CACHE", Path.home() / ".cache" / "kvscale"))
BIN_DIR = CACHE_DIR / "testbed" / "bin"


def bed_required() -> bool:
    """True when a missing bed must fail the run instead of skipping (KVSCALE_BED=1 or CI=true)."""
    return os.environ.get("KVSCALE_BED", "") not in ("", "0") or os.environ.get("CI", "") == "true"


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds.

    Exceptions raised by `check` count as "not yet" and the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 10) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


@dataclass
class Kube:
    """The bed's API server: a kubernetes client configured from `.testbed/kubeconfig`."""

    kubeconfig: Path
    api_client: Any
    kubectl_bin: str

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @property
    def apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api_client)

    @property
    def apiext(self) -> Any:
        from kubernetes import client

        return client.ApiextensionsV1Api(self.api_client)

    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)

    def kubectl(
        self, *args: str, input: str | None = None, timeout: float = 120, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the bed; never raises on a non-zero exit unless check=True."""
        return subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def create_namespace(self, test_name: str) -> str:
        """A fresh namespace named after a test (with its `default` ServiceAccount, without which pods are
        rejected); the caller deletes it (delete_namespace)."""
        from kubernetes import client

        base = "".join(c if c.isalnum() else "-" for c in test_name.lower())[:40].strip("-")
        name = f"{base}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        wait_until(lambda: self.core.read_namespaced_service_account("default", name), timeout=60,
                   what=f"serviceaccount {name}/default")
        return name

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace; the namespace controller (kube-controller-manager) deletes its contents in the
        background."""
        self.core.delete_namespace(name, propagation_policy="Background")


@dataclass
class Prometheus:
    """The bed's Prometheus; scrape targets are file_sd JSON files in .testbed/prometheus/targets."""

    url: str
    targets_dir: Path
    added: set[str] = field(default_factory=set)

    def add_target(self, name: str, host_port: str, labels: dict[str, str] | None = None) -> Path:
        """Scrape `host_port` (http://host:port/metrics) with extra target labels."""
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"target name must be [A-Za-z0-9_-]: {name!r}")
        path = self.targets_dir / f"{name}.json"
        tmp = self.targets_dir / f".{name}.json.tmp"  # not matched by the *.json glob
        tmp.write_text(json.dumps([{"targets": [host_port], "labels": dict(labels or {})}]))
        tmp.replace(path)  # atomic: Prometheus never reads a half-written file
        self.added.add(name)
        return path

    def remove_target(self, name: str) -> None:
        (self.targets_dir / f"{name}.json").unlink(missing_ok=True)
        self.added.discard(name)

    def api(self, path: str, **params: str) -> Any:
        qs = f"?{urllib.parse.urlencode(params)}" if params else ""
        body = http_json(f"{self.url}/api/v1/{path}{qs}")
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus /api/v1/{path} failed: {body}")
        return body["data"]

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return active

    def wait_for_target_up(self, host_port: str, timeout: float = 30) -> dict[str, Any]:
        """Wait until Prometheus has scraped `host_port` successfully; returns the target."""

        def up() -> dict[str, Any] | None:
            for t in self.targets():
                if t["labels"].get("instance") == host_port and t["health"] == "up":
                    return t
            return None

        result: dict[str, Any] = wait_until(up, timeout, f"Prometheus target {host_port} up")
        return result

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; returns data.result (a list of {metric, value})."""
        data = self.api("query", query=promql)
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for_query(
        self,
        promql: str,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = 30,
    ) -> list[dict[str, Any]]:
        """Poll an instant query until `predicate(result)` holds (default: non-empty)."""

        def check() -> list[dict[str, Any]] | None:
            result = self.query(promql)
            return result if predicate(result) else None

        found: list[dict[str, Any]] = wait_until(check, timeout, f"PromQL {promql!r}")
        return found


@dataclass
class InferenceSim:
    """One llm-d-inference-sim process on 127.0.0.1 (OpenAI API + vLLM-style /metrics)."""

    model: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    pid_path: Path

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host_port}"

    def completion(self, prompt: str = "Hello from kvscale", max_tokens: int = 8, ignore_eos: bool = False) -> Any:
        """One real /v1/completions request; returns the decoded JSON response. The simulator draws the
        output length at random up to `max_tokens` (finish reason "stop", or "length" at the bound);
        `ignore_eos` makes it exactly `max_tokens`, finishing by "length", as vLLM does."""
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens}
        if ignore_eos:
            body["ignore_eos"] = True
        return http_json(f"{self.url}/v1/completions", body, timeout=30)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            text: str = resp.read().decode()
            return text

    def stop(self, cut: bool = False) -> None:
        """SIGTERM (the simulator then finishes its open streams, for up to 10 s), or with `cut` SIGKILL: the
        streams end mid-response, as vLLM's do on SIGTERM (it cancels its HTTP server)."""
        if self.process.poll() is None:
            if cut:  # the whole session it was started in (start_new_session): no engine worker outlives it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            else:
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.pid_path.unlink(missing_ok=True)


SimFactory = Callable[..., InferenceSim]
"""Type of the `inference_sim` fixture: `inference_sim(model=..., ...) -> InferenceSim`."""


def start_inference_sim(
    binary: str,
    model: str = "kvscale/test-model",
    max_num_seqs: int = 5,
    ttft_ms: int = 10,
    itl_ms: int = 2,
    extra_args: list[str] | None = None,
    startup_timeout: float = 30,
    mode: str = "random",
) -> InferenceSim:
    """Start `llm-d-inference-sim` on a free loopback port and wait until /health answers 200.

    Its output goes to .testbed/logs/llm-d-inference-sim-PORT.log and its PID to
    .testbed/pids/llm-d-inference-sim-PORT.pid, so down.sh can stop one a crashed session leaked.
    The simulator has no bind-address flag: it listens on all interfaces; we only ever use 127.0.0.1.
    """
    return launch_sim(lambda port: [
        binary,
        f"--port={port}",
        f"--model={model}",
        f"--max-num-seqs={max_num_seqs}",
        f"--time-to-first-token={ttft_ms}ms",
        f"--inter-token-latency={itl_ms}ms",
        f"--mode={mode}",
        # hermetic: never call the tokenizer render service (--render-url) for HF-like names
        "--force-dummy-tokenizer",
        *(extra_args or []),
    ], model, startup_timeout)


def launch_sim(argv_for_port: Callable[[int], list[str]], served_model: str, startup_timeout: float = 30,
               env: Mapping[str, str] | None = None, name: str = "llm-d-inference-sim") -> InferenceSim:
    """Start one `llm-d-inference-sim` on a free loopback port and wait until /health answers 200.

    Its output goes to .testbed/logs/llm-d-inference-sim-PORT.log and its PID to
    .testbed/pids/llm-d-inference-sim-PORT.pid, so down.sh can stop one a crashed session leaked.
    The bed tests and the e2e pod simulators both start theirs here.
    """
    logs, pids = STATE_DIR / "logs", STATE_DIR / "pids"
    logs.mkdir(parents=True, exist_ok=True)
    pids.mkdir(parents=True, exist_ok=True)
    last_log, argv = "", [""]
    for _attempt in range(3):  # a probed free port can be taken before the sim binds it: retry
        port = free_port()
        log_path = logs / f"{name}-{port}.log"
        argv = argv_for_port(port)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=None if env is None else dict(env), start_new_session=True)
        pid_path = pids / f"{name}-{port}.pid"
        pid_path.write_text(f"{proc.pid}\n")
        sim = InferenceSim(served_model, port, proc, log_path, pid_path)
        deadline = time.monotonic() + startup_timeout
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{sim.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return sim
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        sim.stop()
        last_log = log_path.read_text(errors="replace")[-3000:]
        if "address already in use" not in last_log:
            break
    raise RuntimeError(f"{name} did not become healthy: {argv}\n{last_log}")

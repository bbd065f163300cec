"""A "kubelet" for the test bed's fake GPU nodes: one llm-d-inference-sim process per Running serving pod.

kwok marks the operator's vLLM pods Running without running anything. `PodSim` watches (polls every
`poll_interval_s`) the pods of kvscale-managed Deployments in some namespaces and, for every Running pod,
starts one llm-d-inference-sim on a free 127.0.0.1 port configured from the pod itself:

* `--model` / `--served-model-name`, `--max-num-seqs`, `--max-model-len` from the container args;
* a KV cache (`--kv-cache-size` blocks of 16 tokens, `--enable-kvcache`) sized with kvscale's memory
  model for the pod's GPU (its node's `nvidia.com/gpu.product` label), TP degree, precision and
  `--gpu-memory-utilization`, so `vllm:kv_cache_usage_perc` moves like a real engine's;
* latency from published figures for that model and GPU (sim_profiles.py: llm-d-inference-sim's
  latency profiles and reference tables), per-token prefill, with `--time-factor-under-load` so
  prefill and decode slow down as the batch fills.

Each simulator is registered as a Prometheus file-SD target with the labels `namespace`, `pod` and
`llmdeployment` (from the pod label `kvscale.dev/llmdeployment`): the relabelling a real PodMonitor
would do, so `sum by (namespace, llmdeployment) (...)` works as in a cluster.

When a pod stops being Running or is deleted, its simulator leaves `endpoints()` at once (like an
Endpoints removal) and is stopped as a kubelet would stop its container: a pod with a preStop hook (kvscale's
drain) first finishes what it is serving, for at most the pod's terminationGracePeriodSeconds (Kubernetes'
default 30 s when unset); a pod without one gets SIGTERM at once, which vLLM answers by cancelling its server,
so the requests in flight fail. Its target is removed with it. `close()` stops everything.

Processes follow bedkit's conventions: log .testbed/logs/llm-d-inference-sim-PORT.log, PID file
.testbed/pids/llm-d-inference-sim-PORT.pid (so tests/testbed/down.sh stops any a crash leaked).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bedctl import binary
from bedkit import InferenceSim, Kube, Prometheus, launch_sim, wait_until
from sim_profiles import LatencyProfile, profile_for

from kvscale.api.spec import KvCacheDtype, Precision
from kvscale.catalog import GpuSpec, find_gpu, resolve_architecture
from kvscale.kube.leaderworkerset import LEADER_INDEX, WORKER_INDEX_LABEL
from kvscale.perfmodel.memory import compute_kv_capacity

log = logging.getLogger("podsim")

MANAGED_SELECTOR = "app.kubernetes.io/managed-by=kvscale"
OWNER_LABEL = "kvscale.dev/llmdeployment"
GPU_PRODUCT_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name")
BLOCK_SIZE = 16  # vLLM's default block size (CacheConfig.DEFAULT_BLOCK_SIZE)
# vLLM `get_batch_defaults`: max-num-batched-tokens 8192 on >= 70 GiB GPUs other than A100, else 2048.
LARGE_GPU_BYTES = 70 * 2**30
# The simulator publishes KV events over ZMQ when --enable-kvcache is on; nobody listens in the bed, and
# port 1 (tcpmux) is privileged and never served, so the connection is refused instead of reaching
# some other test's server.
ZMQ_SINK = "tcp://127.0.0.1:1"
DEFAULT_GRACE_S = 30.0  # Kubernetes' terminationGracePeriodSeconds when a pod sets none


@dataclass(frozen=True)
class PodLaunch:
    """What a serving pod asks its engine for (parsed from its container args) and where it runs."""

    model: str
    served_model_name: str
    max_num_seqs: int
    max_model_len: int
    tensor_parallel: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    quantization: str | None
    dtype: str | None
    gpu_product: str | None
    pipeline_parallel: int = 1  # a LeaderWorkerSet leader's stages: its group's GPUs hold the weights together
    data_parallel: int = 1  # engines of a data-parallel replica: the leader's simulator stands for them all


def _flag(args: Sequence[str], *names: str) -> str | None:
    """The value of the last occurrence of any of `names` (`--x v` or `--x=v`): the engines' own rule."""
    value = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(f"{name}="):
                value = arg.split("=", 1)[1]
    return value


def parse_launch(pod: Mapping[str, Any], node_labels: Mapping[str, str] | None = None) -> PodLaunch:
    """The engine settings of a pod (a dict in the API's JSON shape)."""
    container = pod["spec"]["containers"][0]
    args = [*(container.get("command") or []), *(container.get("args") or [])]
    model = _flag(args, "--model", "--model-path") or "unknown-model"
    served = _flag(args, "--served-model-name") or model
    product = None
    for labels in (node_labels or {}, pod["spec"].get("nodeSelector") or {}):
        product = product or next((labels[k] for k in GPU_PRODUCT_LABELS if k in labels), None)
    engines = int(_flag(args, "--data-parallel-size", "-dp") or 1)
    return PodLaunch(
        model=model,
        served_model_name=served,
        # --max-num-seqs applies per data-parallel engine; the simulator serves the whole replica
        max_num_seqs=int(_flag(args, "--max-num-seqs", "--max-running-requests") or 256) * engines,
        max_model_len=int(_flag(args, "--max-model-len", "--context-length") or 8192),
        tensor_parallel=int(_flag(args, "--tensor-parallel-size", "-tp", "--tp-size") or 1),
        gpu_memory_utilization=float(_flag(args, "--gpu-memory-utilization", "--mem-fraction-static") or 0.9),
        kv_cache_dtype=_flag(args, "--kv-cache-dtype") or "auto",
        quantization=_flag(args, "--quantization", "-q"),
        dtype=_flag(args, "--dtype"),
        gpu_product=product,
        pipeline_parallel=int(_flag(args, "--pipeline-parallel-size", "-pp", "--pp-size") or 1),
        data_parallel=engines,
    )


def kv_cache_blocks(launch: PodLaunch, gpu: GpuSpec) -> int:
    """KV-cache blocks of one replica, as vLLM would size them (kvscale's memory model, vLLM's rules)."""
    arch = resolve_architecture(launch.model)
    precision = arch.native_precision
    if launch.quantization == "fp8":
        precision = Precision.FP8
    elif launch.dtype in ("bfloat16", "float16"):
        precision = Precision.BF16 if launch.dtype == "bfloat16" else Precision.FP16
    kv_dtype = KvCacheDtype.FP8 if launch.kv_cache_dtype.startswith("fp8") else KvCacheDtype.AUTO
    large = gpu.memory_bytes >= LARGE_GPU_BYTES and not gpu.name.startswith("A100")
    # the simulator stands for the whole replica: all its GPUs (every pipeline stage's) hold weights and KV
    capacity = compute_kv_capacity(arch, gpu.memory_bytes, precision, kv_dtype, launch.tensor_parallel,
                                   launch.gpu_memory_utilization, 8192 if large else 2048,
                                   launch.max_num_seqs // launch.data_parallel,
                                   pipeline_parallel=launch.pipeline_parallel, data_parallel=launch.data_parallel)
    tokens = capacity.tokens * launch.data_parallel  # every engine's cache
    # vLLM refuses to start below one max-length request; the operator only plans configurations that fit.
    return max(tokens // BLOCK_SIZE, math.ceil(launch.max_model_len / BLOCK_SIZE) + 1)


@dataclass(frozen=True)
class SimConfig:
    """Everything a simulator for one pod is started with."""

    launch: PodLaunch
    gpu: str  # catalog name
    profile: LatencyProfile
    kv_blocks: int

    def args(self) -> list[str]:
        launch = self.launch
        return [
            f"--model={launch.model}",
            f"--served-model-name={launch.served_model_name}",
            f"--max-num-seqs={launch.max_num_seqs}",
            f"--max-model-len={launch.max_model_len}",
            "--enable-kvcache",
            f"--kv-cache-size={self.kv_blocks}",
            f"--block-size={BLOCK_SIZE}",
            f"--zmq-endpoint={ZMQ_SINK}",
            "--mode=random",
            "--force-dummy-tokenizer",  # hermetic: never call a tokenizer service
            *self.profile.sim_args(),
        ]


def sim_config(launch: PodLaunch) -> SimConfig:
    gpu = find_gpu(launch.gpu_product or "H100-SXM")
    return SimConfig(launch=launch, gpu=gpu.name, profile=profile_for(launch.model, gpu.name, launch.tensor_parallel),
                     kv_blocks=kv_cache_blocks(launch, gpu))


def spawn_sim(sim_binary: str, config: SimConfig, seed: int, startup_timeout: float = 30) -> InferenceSim:
    """Start one simulator on a free loopback port and wait for /health (retrying a port lost to a race)."""
    env = {**os.environ, "POD_IP": "127.0.0.1"}  # the simulator's KV cache wants to know its pod IP
    return launch_sim(lambda port: [sim_binary, f"--port={port}", f"--seed={seed}", *config.args()],
                      config.launch.served_model_name, startup_timeout, env)


_GAUGE = re.compile(r"^(vllm:num_requests_running|vllm:num_requests_waiting)\{[^}]*\} ([0-9.eE+-]+)$", re.M)


def busy_requests(sim: InferenceSim) -> float:
    """Requests the simulator is running or queueing (from its /metrics); inf when it does not answer."""
    try:
        text = sim.metrics_text()
    except (OSError, urllib.error.URLError):
        return math.inf
    return sum(float(value) for _name, value in _GAUGE.findall(text))


@dataclass
class PodSimulator:
    """The simulator standing in for one serving pod."""

    namespace: str
    pod: str
    uid: str
    llmdeployment: str
    config: SimConfig
    sim: InferenceSim
    target: str
    started_at: float
    grace_s: float = DEFAULT_GRACE_S  # the pod's terminationGracePeriodSeconds
    drains: bool = False  # whether the pod has a preStop hook that waits for its requests
    draining_since: float | None = None

    @property
    def host_port(self) -> str:
        return self.sim.host_port

    def describe(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "pod": self.pod, "llmdeployment": self.llmdeployment,
                "endpoint": self.host_port, "gpu": self.config.gpu, "tp": self.config.launch.tensor_parallel,
                "max_num_seqs": self.config.launch.max_num_seqs, "kv_blocks": self.config.kv_blocks,
                "profile": self.config.profile.name, "draining": self.draining_since is not None}


def target_name(namespace: str, pod: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"podsim-{namespace}-{pod}")


@dataclass
class PodSim:
    """Runs one simulator per Running kvscale serving pod in `namespaces`; see the module docstring."""

    kube: Kube
    prometheus: Prometheus
    namespaces: Sequence[str]
    poll_interval_s: float = 0.5
    sim_binary: str = field(default_factory=lambda: binary("llm-d-inference-sim"))
    # what serves a pod: llm-d-inference-sim by default; tests/realvllm starts a real vLLM here
    spawn: Callable[[SimConfig, int], InferenceSim] | None = None
    history: list[tuple[float, str, str, str]] = field(default_factory=list)  # (time, start|stop, ns/pod, endpoint)
    _sims: dict[str, PodSimulator] = field(default_factory=dict)  # by pod uid
    _failed: dict[str, float] = field(default_factory=dict)  # pod uid -> when a start last failed
    _nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _api: Any = None

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> PodSim:
        from kubernetes import client, config

        # An API client of our own: the poller thread must not share the test's connection pool.
        self._api = client.CoreV1Api(config.new_client_from_config(config_file=str(self.kube.kubeconfig)))
        self._thread = threading.Thread(target=self._run, name="podsim", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> PodSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop polling, then every simulator, and remove every target this PodSim added."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        with self._lock:
            sims = list(self._sims.values())
            self._sims.clear()
        for sim in sims:
            self._terminate(sim)
        if self._api is not None:
            self._api.api_client.close()

    # --- what the load generator and tests read ------------------------------------------------
    def endpoints(self, llmdeployment: str, namespace: str | None = None) -> list[str]:
        """host:port of the simulators serving `llmdeployment` now (not those draining)."""
        with self._lock:
            return sorted(s.host_port for s in self._sims.values()
                          if s.llmdeployment == llmdeployment and s.draining_since is None
                          and (namespace is None or s.namespace == namespace))

    def simulators(self, llmdeployment: str | None = None, include_draining: bool = False) -> list[PodSimulator]:
        with self._lock:
            return [s for s in self._sims.values()
                    if (llmdeployment is None or s.llmdeployment == llmdeployment)
                    and (include_draining or s.draining_since is None)]

    def wait_for(self, llmdeployment: str, count: int, timeout: float = 60,
                 namespace: str | None = None) -> list[str]:
        """Wait until exactly `count` simulators serve `llmdeployment` and none of its old ones is left."""

        def settled() -> tuple[list[str]] | None:  # a 1-tuple, so that "no endpoints" is truthy too
            eps = self.endpoints(llmdeployment, namespace)
            draining = [s for s in self.simulators(llmdeployment, include_draining=True) if s.draining_since]
            return (eps,) if len(eps) == count and not draining else None

        found: tuple[list[str]] = wait_until(settled, timeout, f"{count} simulator(s) for {llmdeployment}",
                                             interval=0.2)
        return found[0]

    # --- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception as exc:  # the bed's API may blip: keep the simulators we have and retry
                if not failing:
                    log.warning("podsim: sync failed, keeping the simulators and retrying: %s", str(exc)[:200])
                log.debug("podsim sync failure", exc_info=True)
                failing = True
            else:
                if failing:
                    log.warning("podsim: the API server answers again")
                failing = False
            self._stop.wait(self.poll_interval_s)

    def _running_pods(self) -> dict[str, dict[str, Any]]:
        pods: dict[str, dict[str, Any]] = {}
        for namespace in self.namespaces:
            listed = self._api.list_namespaced_pod(namespace, label_selector=MANAGED_SELECTOR, _request_timeout=10)
            for pod in self._api.api_client.sanitize_for_serialization(listed)["items"]:
                meta, status = pod["metadata"], pod.get("status") or {}
                labels = meta.get("labels") or {}
                # a LeaderWorkerSet's workers run headless (no API, no /metrics): only leaders serve
                if status.get("phase") == "Running" and not meta.get("deletionTimestamp") \
                        and OWNER_LABEL in labels and labels.get(WORKER_INDEX_LABEL, LEADER_INDEX) == LEADER_INDEX:
                    pods[meta["uid"]] = pod
        return pods

    def _node_labels(self, node_name: str | None) -> dict[str, str]:
        if not node_name:
            return {}
        if node_name not in self._nodes:
            node = self._api.read_node(node_name, _request_timeout=10)
            self._nodes[node_name] = dict(node.metadata.labels or {})
        return self._nodes[node_name]

    def sync_once(self) -> None:
        """One pass: start simulators for new Running pods, then drain those whose pod went away. In that order:
        where one pass sees both (a Deployment replaced once its successor's pods are Ready), the new pods
        serve before the old ones leave endpoints(), as a Service's endpoints gain the Ready pods before the
        terminating ones go; drained first, a load generator found no endpoint while the new ones spawned."""
        pods = self._running_pods()
        now = time.monotonic()
        with self._lock:
            known = set(self._sims)
        for uid, pod in pods.items():
            if uid in known or now - self._failed.get(uid, -math.inf) < 5:
                continue
            try:
                started = self._start(pod)
            except Exception:
                self._failed[uid] = now
                log.exception("could not start a simulator for pod %s", pod["metadata"]["name"])
                continue
            with self._lock:
                self._sims[uid] = started
        now = time.monotonic()
        with self._lock:
            for uid, sim in self._sims.items():
                if uid not in pods and sim.draining_since is None:
                    sim.draining_since = now  # out of endpoints() from now on
                    log.info("pod %s/%s is gone or not Running: draining %s", sim.namespace, sim.pod, sim.host_port)
            draining = [s for s in self._sims.values() if s.draining_since is not None]
        for sim in draining:
            assert sim.draining_since is not None
            if not sim.drains or busy_requests(sim.sim) == 0 or now - sim.draining_since >= sim.grace_s:
                with self._lock:
                    self._sims.pop(sim.uid, None)
                self._terminate(sim, cut=True)

    def _start(self, pod: dict[str, Any]) -> PodSimulator:
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        launch = parse_launch(pod, self._node_labels(pod["spec"].get("nodeName")))
        config = sim_config(launch)
        seed = int.from_bytes(meta["uid"].encode()[:6], "big")
        sim = self.spawn(config, seed) if self.spawn else spawn_sim(self.sim_binary, config, seed)
        target = target_name(namespace, name)
        labels = {"namespace": namespace, "pod": name, "llmdeployment": meta["labels"][OWNER_LABEL]}
        self.prometheus.add_target(target, sim.host_port, labels)
        self.history.append((time.time(), "start", f"{namespace}/{name}", sim.host_port))
        log.info("pod %s/%s Running on %s: simulator %s (%s TP%d, max-num-seqs %d, %d KV blocks, profile %s)",
                 namespace, name, launch.gpu_product, sim.host_port, config.gpu, launch.tensor_parallel,
                 launch.max_num_seqs, config.kv_blocks, config.profile.name)
        grace = pod["spec"].get("terminationGracePeriodSeconds")
        drains = bool((pod["spec"]["containers"][0].get("lifecycle") or {}).get("preStop"))
        return PodSimulator(namespace=namespace, pod=name, uid=meta["uid"], llmdeployment=labels["llmdeployment"],
                            config=config, sim=sim, target=target, started_at=time.monotonic(),
                            grace_s=DEFAULT_GRACE_S if grace is None else float(grace), drains=drains)

    def _terminate(self, sim: PodSimulator, cut: bool = False) -> None:
        """Stop a simulator; `cut`: as a kubelet's SIGTERM reaches vLLM, which cuts whatever still streams."""
        sim.sim.stop(cut=cut)
        self.prometheus.remove_target(sim.target)
        self.history.append((time.time(), "stop", f"{sim.namespace}/{sim.pod}", sim.host_port))
        log.info("stopped simulator %s of %s/%s", sim.host_port, sim.namespace, sim.pod)

    def log_paths(self) -> list[Path]:
        with self._lock:
            return [s.sim.log_path for s in self._sims.values()]

"""How each serving engine is launched: its pinned image, command and flags.

The one place that knows engine flag spellings (see the vLLM/SGLang runtime contract) and the
default images. Pure: a `EngineLaunch` in, an argument list out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from kvscale.api.spec import Engine, KvCacheDtype, Precision
from kvscale.perfmodel.precision import check_loadable

SERVING_PORT = 8000
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"

DEFAULT_IMAGES: Mapping[Engine, str] = {
    Engine.VLLM: "vllm/vllm-openai:v0.11.0",
    Engine.SGLANG: "lmsysorg/sglang:v0.5.4",
}

# Explicit, so a custom image with another entrypoint still gets the flags below.
COMMANDS: Mapping[Engine, tuple[str, ...]] = {
    Engine.VLLM: ("vllm", "serve"),
    Engine.SGLANG: ("python3", "-m", "sglang.launch_server"),
}

_SIXTEEN_BIT_DTYPES = {Precision.BF16: "bfloat16", Precision.FP16: "float16"}

# vLLM counts the FLOPs and bytes it computes and moves (vllm:estimated_*_per_gpu_total, which
# calibration fits speed from) with --enable-mfu-metrics. The flag is accepted from 0.14.0 (before 0.17
# it only logs); the counters are exported from 0.17.0 (vllm/v1/metrics/perf.py, PerfMetricsProm).
MFU_COUNTERS_SINCE_VLLM = (0, 17, 0)
# A release tag: v0.17.0, 0.17, 0.17.1.post1, v0.17.0-cu128 (a build variant); not 0.17.0rc1 or nightly-….
_RELEASE_TAG = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.post\d+)?(?:-[A-Za-z0-9_.-]+)?$")


@dataclass(frozen=True)
class EngineLaunch:
    """The engine settings a replica is started with, resolved from the spec and the plan."""

    engine: Engine
    model_name: str
    tensor_parallel: int
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    precision: Precision  # what the plan assumed for the weights
    native_precision: Precision  # what the checkpoint holds
    kv_cache_dtype: KvCacheDtype
    image: str  # the container image (image_for): which flags the engine in it knows
    pipeline_parallel: int = 1  # stages, one node each: >1 is a multi-node replica (a LeaderWorkerSet group)
    # Data-parallel engines with expert parallel (MoE), and how many of them each pod (node) runs: fewer
    # than all makes a multi-node replica too.
    data_parallel: int = 1
    data_parallel_local: int = 1

    @property
    def multi_node(self) -> bool:
        return self.pipeline_parallel > 1 or self.data_parallel_local < self.data_parallel


# A replica over several nodes needs the engine's multi-node launch without Ray: vLLM's --nnodes/--node-rank/
# --master-addr came in 0.11.1 (PR #23691; absent from the 0.11.0 wheel's arg_utils.py, present in 0.11.1's).
# Single-node replicas keep DEFAULT_IMAGES: changing it would roll every existing Deployment.
MULTI_NODE_DEFAULT_IMAGES: Mapping[Engine, str] = {
    Engine.VLLM: "vllm/vllm-openai:v0.11.1",
    Engine.SGLANG: DEFAULT_IMAGES[Engine.SGLANG],
}


def image_for(engine: Engine, image: str | None, multi_node: bool = False) -> str:
    return image or (MULTI_NODE_DEFAULT_IMAGES if multi_node else DEFAULT_IMAGES)[engine]


def vllm_release_of(image: str) -> tuple[int, int, int] | None:
    """The vLLM release a vLLM image (a repository named …vllm…, e.g. vllm/vllm-openai) is tagged with;
    None where the name does not say: no tag, a digest, `latest`, a nightly, a custom image."""
    if "@" in image:
        return None  # pinned by digest: what it runs is the digest's, whatever a tag beside it says
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        return None  # no tag (or the colon was a registry's port)
    if "vllm" not in repository.rsplit("/", 1)[-1].lower():
        return None  # another server's image (llm-d-inference-sim, say): its own version scheme and flags
    release = _RELEASE_TAG.match(tag)
    if release is None:
        return None
    major, minor, patch = release.groups()
    return int(major), int(minor), int(patch or 0)


def exports_mfu_counters(image: str) -> bool:
    """Whether the image's vLLM is known to export the MFU counters with --enable-mfu-metrics. vLLM
    rejects flags it does not know (the pod would crash-loop), so an image whose release is unknown does
    not get the flag: add it through spec.serving.extraArgs for such an image."""
    release = vllm_release_of(image)
    return release is not None and release >= MFU_COUNTERS_SINCE_VLLM


def precision_args(launch: EngineLaunch) -> list[str]:
    """Flags that make the engine load the weights at the planned precision (`check_loadable` says
    which changes of precision the engines can make on load; a checkpoint in the wanted format needs
    no flag: the engine detects it)."""
    wanted, native = launch.precision, launch.native_precision
    check_loadable(wanted, native, launch.model_name)
    if wanted == native:
        return []
    if wanted == Precision.FP8:
        return ["--quantization", "fp8"]
    return ["--dtype", _SIXTEEN_BIT_DTYPES[wanted]]


# A LeaderWorkerSet's pod webhook gives every pod of a group these variables; Kubernetes expands $(NAME)
# in args from the container's environment. The leader has worker index 0.
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
# SGLang's rendezvous port on the leader (its --dist-init-addr needs one; the value is SGLang's example).
SGLANG_DIST_INIT_PORT = 20000


# Where the data-parallel engines of a group find their coordinator on the leader (vLLM's docs use 13345).
DATA_PARALLEL_RPC_PORT = 13345


def data_parallel_args(launch: EngineLaunch, leader: bool) -> list[str]:
    """vLLM's data-parallel engines with expert-parallel MoE layers (docs/serving/data_parallel_deployment.md,
    internal load balancing): one API server on the leader, `--data-parallel-size-local` engines per pod;
    workers run `--headless` from their first rank (`--data-parallel-start-rank`, which worker_command
    computes from the worker index)."""
    args = ["--data-parallel-size", str(launch.data_parallel), "--enable-expert-parallel"]
    if not launch.multi_node:
        return args
    args += ["--data-parallel-size-local", str(launch.data_parallel_local),
             "--data-parallel-address", f"$({LEADER_ADDRESS_ENV})",
             "--data-parallel-rpc-port", str(DATA_PARALLEL_RPC_PORT)]
    return args if leader else [*args, "--headless"]


def worker_command(launch: EngineLaunch, command: list[str]) -> list[str]:
    """A worker pod's command. Data-parallel workers start at rank index x engines-per-pod, which Kubernetes
    cannot compute from $(LWS_WORKER_INDEX): a shell does, then execs the engine with the container's args."""
    if launch.data_parallel <= 1:
        return command
    start_rank = f"$(({WORKER_INDEX_ENV} * {launch.data_parallel_local}))"
    return ["/bin/sh", "-c", f'exec {" ".join(command)} "$@" --data-parallel-start-rank {start_rank}', command[0]]


def multi_node_args(launch: EngineLaunch, leader: bool) -> list[str]:
    """Flags that join one pod to a replica spread over `pipeline_parallel` nodes, one stage per node.

    vLLM (multiprocessing backend, no Ray; `--nnodes` since 0.11): every pod runs `vllm serve` with the same
    parallel sizes and its node rank; the leader (rank 0) serves the API and /metrics, the workers run
    `--headless` (no API server). SGLang: `--nnodes`/`--node-rank` with the leader's rendezvous address.
    """
    stages = launch.pipeline_parallel
    rank = f"$({WORKER_INDEX_ENV})"
    if launch.engine == Engine.VLLM:
        args = ["--pipeline-parallel-size", str(stages), "--nnodes", str(stages), "--node-rank", rank,
                "--master-addr", f"$({LEADER_ADDRESS_ENV})"]
        return args if leader else [*args, "--headless"]
    return ["--pp-size", str(stages), "--nnodes", str(stages), "--node-rank", rank,
            "--dist-init-addr", f"$({LEADER_ADDRESS_ENV}):{SGLANG_DIST_INIT_PORT}"]


def vllm_args(launch: EngineLaunch) -> list[str]:
    args = [
        "--model", launch.model_name,
        "--served-model-name", launch.model_name,
        "--tensor-parallel-size", str(launch.tensor_parallel),
        "--max-num-seqs", str(launch.max_num_seqs),
        "--max-model-len", str(launch.max_model_len),
        "--gpu-memory-utilization", _fraction(launch.gpu_memory_utilization),
    ]
    if launch.kv_cache_dtype == KvCacheDtype.FP8:
        args += ["--kv-cache-dtype", "fp8"]
    if exports_mfu_counters(launch.image):
        args.append("--enable-mfu-metrics")  # calibration fits speed from the counted work
    return [*args, *precision_args(launch), "--port", str(SERVING_PORT)]


def sglang_args(launch: EngineLaunch) -> list[str]:
    # --mem-fraction-static covers weights + KV pool, the closest match to vLLM's fraction.
    args = [
        "--model-path", launch.model_name,
        "--tp-size", str(launch.tensor_parallel),
        "--max-running-requests", str(launch.max_num_seqs),
        "--context-length", str(launch.max_model_len),
        "--mem-fraction-static", _fraction(launch.gpu_memory_utilization),
    ]
    if launch.kv_cache_dtype == KvCacheDtype.FP8:
        args += ["--kv-cache-dtype", "fp8_e4m3"]
    return [
        *args, *precision_args(launch),
        "--port", str(SERVING_PORT), "--host", "0.0.0.0", "--enable-metrics",  # metrics are off by default
    ]


def engine_args(launch: EngineLaunch, extra_args: list[str], leader: bool = True) -> list[str]:
    """The container's args; the user's extra arguments come last so they win over ours. A multi-node
    replica's pods (`launch.multi_node`) add their part in it: the leader's, or a worker's."""
    rendered = vllm_args(launch) if launch.engine == Engine.VLLM else sglang_args(launch)
    if launch.data_parallel > 1:
        rendered += data_parallel_args(launch, leader)
    elif launch.pipeline_parallel > 1:
        rendered += multi_node_args(launch, leader)
    return [*rendered, *extra_args]


def _fraction(value: float) -> str:
    return f"{value:.4g}"

"""How each serving engine is launched: its pinned image, command and flags.

The one place that knows engine flag spellings (see the vLLM/SGLang runtime contract) and the
default images. Pure: a `EngineLaunch` in, an argument list out.
"""

from __future__ import annotations

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


def image_for(engine: Engine, image: str | None) -> str:
    return image or DEFAULT_IMAGES[engine]


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


def engine_args(launch: EngineLaunch, extra_args: list[str]) -> list[str]:
    """The container's args; the user's extra arguments come last so they win over ours."""
    rendered = vllm_args(launch) if launch.engine == Engine.VLLM else sglang_args(launch)
    return [*rendered, *extra_args]


def _fraction(value: float) -> str:
    return f"{value:.4g}"

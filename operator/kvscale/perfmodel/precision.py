"""Bytes per weight and which tensor-core rate a precision runs at."""

from __future__ import annotations

from kvscale.api.spec import KvCacheDtype, Precision
from kvscale.catalog.gpus import GpuSpec
from kvscale.errors import InvalidSpecError

SIXTEEN_BIT = frozenset({Precision.BF16, Precision.FP16})

# Bytes per weight of a linear layer, scale metadata included:
# int4 (AWQ/GPTQ): 4-bit values + an fp16 scale and a 4-bit zero per group of 128;
# mxfp4: 4-bit values + one 8-bit shared exponent per 32; int8/fp8: per-channel or 128x128-block
# scales, negligible at these sizes.
WEIGHT_BYTES_PER_PARAM: dict[Precision, float] = {
    Precision.BF16: 2.0,
    Precision.FP16: 2.0,
    Precision.FP8: 1.0 + 4.0 / (128 * 128),
    Precision.INT8: 1.0 + 2.0 / 4096,
    Precision.INT4: 0.5 + (2.0 + 0.5) / 128,
    Precision.MXFP4: 0.5 + 1.0 / 32,
}

# Embeddings, the LM head and norms stay 16-bit in quantized checkpoints.
UNQUANTIZED_BYTES_PER_PARAM = 2.0


def check_loadable(wanted: Precision, native: Precision, model_name: str) -> None:
    """The engines quantize 16-bit weights to fp8 on load and cast between 16-bit types; every other
    change of precision needs a checkpoint already in that format. Raises InvalidSpecError otherwise,
    before a plan is made for weights no engine would load."""
    if wanted == native or (wanted == Precision.FP8 and native in SIXTEEN_BIT) or (
            wanted in SIXTEEN_BIT and native in SIXTEEN_BIT):
        return
    raise InvalidSpecError(
        f"spec.model.precision: {wanted} needs a checkpoint already quantized to {wanted}; "
        f"{model_name} is {native} (the engines can only quantize 16-bit weights to fp8 on load)"
    )


def kv_bytes_per_element(kv_cache_dtype: KvCacheDtype) -> int:
    return 1 if kv_cache_dtype is KvCacheDtype.FP8 else 2


def linear_flops_per_s(gpu: GpuSpec, precision: Precision) -> float:
    """Peak dense rate of the GEMMs for weights of `precision`.

    fp8 runs W8A8 on GPUs with fp8 tensor cores, weight-only (16-bit math) elsewhere; int8 runs W8A8
    int8; 4-bit formats run weight-only kernels with 16-bit math (Marlin-style), except mxfp4 on GPUs
    with fp4 tensor cores.
    """
    if precision is Precision.FP8 and gpu.fp8_flops_per_s:
        return gpu.fp8_flops_per_s
    if precision is Precision.INT8 and gpu.int8_ops_per_s:
        return gpu.int8_ops_per_s
    if precision is Precision.MXFP4 and gpu.fp4_flops_per_s:
        return gpu.fp4_flops_per_s
    return gpu.bf16_flops_per_s


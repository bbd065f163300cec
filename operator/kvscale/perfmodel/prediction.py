"""One-point predictions (`kvscale predict`): a replica at a fixed concurrency."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kvscale.perfmodel.memory import kv_bytes_per_token
from kvscale.perfmodel.replica import (
    ReplicaModel,
    ServingSetup,
    build_replica_model,
    compute_replica_kv_capacity,
    replica_weights_bytes_per_gpu,
)
from kvscale.perfmodel.serving import RequestShape, concurrency_limit, estimate_at_concurrency
from kvscale.units import s_to_ms


@dataclass(frozen=True)
class PointPrediction:
    """A replica serving `batch` concurrent requests of the given shape (continuous batching)."""

    ttft_ms: float
    tpot_ms: float
    decode_step_ms: float
    prefill_ms: float
    fixed_batch_latency_s: float  # all `batch` requests start together (benchmark_latency)
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    kv_bytes_per_token: int
    weights_bytes_per_gpu: float
    kv_cache_tokens: int
    max_concurrency: int  # sequences the KV cache holds at this shape
    bound: str  # what limits the decode step: memory-bandwidth, compute, or kv-capacity

    def to_dict(self) -> dict[str, float | int | str]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def decode_bound(model: ReplicaModel, batch: float, context_tokens: float) -> str:
    """Whether the weight-and-KV reads or the FLOPs take longer in a decode step."""
    eff = model.setup.efficiency
    gpu = model.setup.gpu
    arch = model.arch
    bytes_s = (model.always_read_bytes + model.routed_expert_bytes * arch.num_moe_layers * arch.num_experts
               + batch * float(model.effective_context(context_tokens)) * model.kv_bytes_per_token_per_layer
               * arch.num_layers) / (gpu.hbm_bandwidth_bytes_per_s * eff.hbm_bandwidth)
    flops_s = batch * (model.linear_flops_per_token + model.expert_flops_per_token + model.lm_head_flops_per_token) / (
        model.linear_flops_per_s * eff.compute)
    return "compute" if flops_s > bytes_s else "memory-bandwidth"


def fixed_batch_latency_s(model: ReplicaModel, shape: RequestShape, batch: float) -> float:
    """End-to-end time of `batch` requests started together: one batched prefill, then decode steps."""
    prefill = float(model.prefill_s(shape.input_tokens, batch))
    steps = np.arange(max(int(shape.output_tokens) - 1, 0), dtype=np.float64)
    decode = float(np.sum(model.decode_step_s(batch, shape.input_tokens + steps))) if steps.size else 0.0
    return prefill + decode


def predict_point(setup: ServingSetup, shape: RequestShape, batch: int, quantile: float = 0.5) -> PointPrediction:
    model = build_replica_model(setup)
    capacity = compute_replica_kv_capacity(setup, max(batch, 1), shape.mean_context_tokens)
    slots = int(concurrency_limit(shape, batch * 10**6, capacity.tokens))
    at = estimate_at_concurrency(model, shape, float(batch), quantile)
    bound = "kv-capacity" if batch > slots else decode_bound(model, batch, shape.mean_context_tokens)
    return PointPrediction(
        ttft_ms=s_to_ms(float(at.ttft_mean_s)),
        tpot_ms=s_to_ms(float(at.tpot_mean_s)),
        decode_step_ms=s_to_ms(float(at.decode_step_s)),
        prefill_ms=s_to_ms(float(model.prefill_s(shape.input_tokens))),
        fixed_batch_latency_s=fixed_batch_latency_s(model, shape, batch),
        output_tokens_per_s=float(at.output_tokens_per_s),
        output_tokens_per_s_per_gpu=float(at.output_tokens_per_s) / setup.tensor_parallel,
        kv_bytes_per_token=kv_bytes_per_token(setup.arch, setup.kv_cache_dtype),
        weights_bytes_per_gpu=replica_weights_bytes_per_gpu(setup),
        kv_cache_tokens=capacity.tokens,
        max_concurrency=slots,
        bound=bound,
    )

"""One-point predictions (`kvscale predict`): a replica under a static batch, a closed loop of
clients or an open loop of Poisson arrivals."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum

import numpy as np

from kvscale.perfmodel.memory import kv_bytes_per_token
from kvscale.perfmodel.replica import (
    ReplicaModel,
    ServingSetup,
    build_replica_model,
    compute_replica_kv_capacity,
    replica_weights_bytes_per_gpu,
)
from kvscale.perfmodel.serving import (
    RequestShape,
    concurrency_limit,
    estimate_at_concurrency,
    estimate_at_rate,
    run_ttft_mean_s,
)
from kvscale.units import s_to_ms


class LoadKind(StrEnum):
    """How the load is applied, as the benchmark tools do it."""

    STATIC_BATCH = "static-batch"  # `batch` requests started together (vllm bench latency)
    CLOSED_LOOP = "closed-loop"  # `concurrency` clients, each sending its next request when one ends
    OPEN_LOOP = "open-loop"  # Poisson arrivals at `request_rate` per second


@dataclass(frozen=True)
class Load:
    kind: LoadKind
    value: float  # batch, concurrency or requests/s
    # closed loop: the requests of a benchmark run whose clients all start at once (vllm bench serve
    # --num-prompts): its mean TTFT counts the first wave's queue; None: the steady state alone
    run_requests: float | None = None


@dataclass(frozen=True)
class PointPrediction:
    """A replica under one load: latencies (means and the percentile), throughput and memory."""

    load: str
    load_value: float
    run_requests: float | None  # closed loop: the run's requests, its clients starting together
    percentile: float
    ttft_ms: float  # mean (over the run's requests where the load names them, else the steady state's)
    ttft_steady_ms: float  # mean with the clients out of step, the first wave left out
    ttft_percentile_ms: float  # the steady state's
    tpot_ms: float  # mean
    tpot_percentile_ms: float
    decode_step_ms: float
    prefill_ms: float  # one prompt alone
    requests_per_s: float
    running_seqs: float
    fixed_batch_latency_s: float | None  # static batch only: the whole batch, first prompt to last token
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    kv_bytes_per_token: int
    weights_bytes_per_gpu: float
    kv_cache_tokens: int
    max_concurrency: int  # sequences the KV cache holds at this shape (the full length each)
    max_num_seqs: int
    stable: bool  # open loop: below saturation (else the queue grows without bound)
    bound: str  # what limits the decode step: memory-bandwidth, compute, or kv-capacity

    def to_dict(self) -> dict[str, float | int | str | bool | None]:
        """JSON-ready: floats rounded, an unbounded latency (an overloaded open loop) as null."""
        return {k: ((round(v, 4) if math.isfinite(v) else None) if isinstance(v, float) else v)
                for k, v in asdict(self).items()}


def decode_bound(model: ReplicaModel, batch: float, context_tokens: float) -> str:
    """Whether the weight-and-KV reads or the FLOPs take longer in a decode step."""
    eff = model.setup.efficiency
    gpu = model.setup.gpu
    arch = model.arch
    # Weights and KV at the rates the step's terms read them (ReplicaModel.pass_terms).
    weights_s = (model.always_read_bytes + model.routed_expert_bytes * arch.num_moe_layers * arch.num_experts) / (
        gpu.hbm_bandwidth_bytes_per_s * eff.hbm_bandwidth * gpu.weight_streaming_scale)
    kv_s = (batch * float(model.effective_context(context_tokens)) * model.kv_bytes_per_token_per_layer
            * arch.num_layers) / (gpu.hbm_bandwidth_bytes_per_s * eff.attention_bandwidth)
    bytes_s = weights_s + kv_s
    flops_s = batch * (model.linear_flops_per_token + model.expert_flops_per_token / model.expert_compute_share
                       + model.lm_head_flops_per_token) / (model.linear_flops_per_s * eff.compute)
    return "compute" if flops_s > bytes_s else "memory-bandwidth"


def fixed_batch_latency_s(model: ReplicaModel, shape: RequestShape, batch: float) -> float:
    """End-to-end time of `batch` requests started together: one batched prefill, then decode steps."""
    prefill = float(model.prefill_s(shape.input_tokens, batch))
    steps = np.arange(max(int(shape.output_tokens) - 1, 0), dtype=np.float64)
    decode = float(np.sum(model.decode_step_s(batch, shape.input_tokens + steps))) if steps.size else 0.0
    return prefill + decode


def _finite_ms(seconds: float) -> float:
    return s_to_ms(seconds) if math.isfinite(seconds) else math.inf


def predict_point(setup: ServingSetup, shape: RequestShape, load: Load, max_num_seqs: int = 256,
                  quantile: float = 0.95) -> PointPrediction:
    """One replica under `load`. Closed and open loops run at most `max_num_seqs` sequences, or as
    many as the KV cache holds at their mean occupancy (vLLM admits while blocks last)."""
    model = build_replica_model(setup)
    capacity = compute_replica_kv_capacity(setup, max_num_seqs, shape.mean_context_tokens)
    full_length = int(concurrency_limit(shape, 10**9, capacity.tokens))
    slots = float(concurrency_limit(shape, max_num_seqs, capacity.tokens, oversubscribe=True))
    latency: float | None = None
    if load.kind is LoadKind.STATIC_BATCH:
        batch = load.value
        prefill = float(model.prefill_s(shape.input_tokens, batch))
        latency = fixed_batch_latency_s(model, shape, batch)
        tpot = (latency - prefill) / max(shape.output_tokens - 1.0, 1.0)
        ttft_mean = ttft_q = steady_ttft = prefill
        tpot_mean = tpot_q = tpot
        rate, running, stable = batch / latency, batch, True
        decode_step = float(model.decode_step_s(batch, shape.mean_context_tokens))
        concurrent = batch
    else:
        if load.kind is LoadKind.CLOSED_LOOP:
            at = estimate_at_concurrency(model, shape, load.value, quantile, slots=slots)
        else:
            at = estimate_at_rate(model, shape, load.value, slots, quantile)
        ttft_mean, ttft_q = float(at.ttft_mean_s), float(at.ttft_quantile_s)
        steady_ttft = ttft_mean
        if load.kind is LoadKind.CLOSED_LOOP and load.run_requests is not None and math.isfinite(ttft_mean):
            ttft_mean = run_ttft_mean_s(model, shape, min(load.value, slots), load.run_requests, ttft_mean)
        tpot_mean, tpot_q = float(at.tpot_mean_s), float(at.tpot_quantile_s)
        rate, running, stable = float(at.request_rate), float(at.running_seqs), bool(at.stable)
        decode_step = float(at.decode_step_s)
        concurrent = running
    throughput = rate * shape.output_tokens
    bound = "kv-capacity" if concurrent > full_length else decode_bound(model, concurrent, shape.mean_context_tokens)
    return PointPrediction(
        load=load.kind.value,
        load_value=load.value,
        run_requests=load.run_requests,
        percentile=quantile * 100.0,
        ttft_ms=_finite_ms(ttft_mean),
        ttft_steady_ms=_finite_ms(steady_ttft),
        ttft_percentile_ms=_finite_ms(ttft_q),
        tpot_ms=s_to_ms(tpot_mean),
        tpot_percentile_ms=s_to_ms(tpot_q),
        decode_step_ms=s_to_ms(decode_step),
        prefill_ms=s_to_ms(float(model.prefill_s(shape.input_tokens))),
        requests_per_s=rate,
        running_seqs=running,
        fixed_batch_latency_s=latency,
        output_tokens_per_s=throughput,
        output_tokens_per_s_per_gpu=throughput / setup.tensor_parallel,
        kv_bytes_per_token=kv_bytes_per_token(setup.arch, setup.kv_cache_dtype),
        weights_bytes_per_gpu=replica_weights_bytes_per_gpu(setup),
        kv_cache_tokens=capacity.tokens,
        max_concurrency=full_length,
        max_num_seqs=max_num_seqs,
        stable=stable,
        bound=bound,
    )

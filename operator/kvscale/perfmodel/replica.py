"""Roofline step times of one replica (one vLLM engine over `tensor_parallel` x `pipeline_parallel` GPUs).

An engine step runs every running sequence's next token plus, with chunked prefill, a slice of
waiting prompts. Each kernel family is bounded by the slower of its bytes (HBM) and its FLOPs
(tensor cores); the step is their sum plus TP all-reduces and a fixed per-step overhead.
Every method takes numpy arrays and broadcasts.

Pipeline parallel (a replica over `pipeline_parallel` nodes, TP within each): vLLM splits the
running batch into PP micro-batches kept in flight at once, one per stage, so every stage is busy;
each stage runs 1/PP of the layers. A "step" here is then the cycle in which every running sequence
gets its next token: a micro-batch passes through all PP stages (each reading its 1/PP of the
weights and KV, so the pass costs what the whole model costs on TP GPUs for that micro-batch) and
crosses PP-1 node boundaries, and it is back at the first stage when the PP-1 others have had
their turn. Assumed: the decodes spread evenly over the micro-batches (at least one sequence in
each, so a lone sequence pays a full pass: the pipeline bubble at low load); a prompt chunk rides
a single micro-batch, and the heaviest micro-batch paces the cycle (the others wait behind it at
every stage). So per-token latency is the sum of all stages plus the transfers, decode throughput
is about that of PP micro-batches in flight, and prefill gains no speed from PP (conservative
under heavy prompt load, where vLLM would spread prompts over micro-batches too).

Data-parallel attention with expert parallelism (`data_parallel` = D > 1, MoE models): a replica is D
engines of `tensor_parallel` GPUs behind one API server, each with its own scheduler (`max_num_seqs`
and token budget apply per engine) and KV cache, whose MoE layers form one expert-parallel group of
D x TP GPUs. All engines step together (a dispatch and a combine all-to-all in every MoE layer; vLLM
runs dummy steps on idle engines), so the busiest engine paces the step. Here a "step" takes the
replica's whole batch: the decodes spread evenly over the engines (vLLM's front end balances by queue
length), a prompt chunk rides one engine unless more prompts than engines share the step; each GPU's
experts see the tokens of every engine (routing assumed uniform: no hot experts), and each GPU reads
only the distinct experts of its own E / (D x TP). What D buys: expert weights read once per step for
D engines' tokens, and, for MLA models, no cache replicated over TP ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvscale.api.spec import KvCacheDtype, Precision
from kvscale.catalog.architecture import ModelArchitecture
from kvscale.catalog.gpus import GpuSpec
from kvscale.perfmodel.communication import (
    ALL_TO_ALLS_PER_MOE_LAYER,
    ALLREDUCES_PER_LAYER,
    estimate_all_to_all_s,
    estimate_allreduce_s,
    estimate_stage_transfer_s,
)
from kvscale.perfmodel.efficiency import DEFAULT_EFFICIENCY, EfficiencyFactors
from kvscale.perfmodel.memory import (
    KvCapacity,
    compute_kv_capacity,
    compute_parameter_counts,
    compute_weight_bytes,
    kv_bytes_per_token_per_layer,
    weights_bytes_per_gpu,
)
from kvscale.perfmodel.precision import linear_flops_per_s
from kvscale.units import GIB

Array = NDArray[np.float64]
ACTIVATION_BYTES = 2  # 16-bit hidden states on the wire
LARGE_GPU_BYTES = 70 * GIB


def default_max_num_batched_tokens(gpu: GpuSpec) -> int:
    """vLLM's serve default token budget per step: 8192 on >=70 GiB GPUs other than A100, else 2048."""
    if gpu.memory_bytes >= LARGE_GPU_BYTES and "A100" not in gpu.name.upper():
        return 8192
    return 2048


@dataclass(frozen=True)
class ServingSetup:
    """Everything that fixes a replica's speed: model, GPU, parallelism, precisions, engine knobs."""

    arch: ModelArchitecture
    gpu: GpuSpec
    tensor_parallel: int
    precision: Precision
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO
    gpu_memory_utilization: float = 0.90
    max_num_batched_tokens: int = 0  # 0: vLLM's default for the GPU
    efficiency: EfficiencyFactors = field(default=DEFAULT_EFFICIENCY)
    pipeline_parallel: int = 1  # stages, one node each (vLLM --pipeline-parallel-size)
    # Engines with data-parallel attention and expert-parallel MoE layers (vLLM --data-parallel-size
    # with --enable-expert-parallel), each of `tensor_parallel` GPUs; `gpus_per_node` tells which of the
    # all-to-all's traffic leaves the node.
    data_parallel: int = 1
    gpus_per_node: int = 8

    @property
    def engine_token_budget(self) -> int:
        """One engine's tokens per step (vLLM --max-num-batched-tokens)."""
        return self.max_num_batched_tokens or default_max_num_batched_tokens(self.gpu)

    @property
    def token_budget(self) -> int:
        """The replica's tokens per step: every data-parallel engine's budget."""
        return self.engine_token_budget * self.data_parallel

    @property
    def gpus(self) -> int:
        """GPUs of one replica: TP within a node times PP stages across nodes, times the DP engines."""
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    @property
    def expert_parallel(self) -> int:
        """GPUs the routed experts are split over (1: sharded by TP within each rank instead)."""
        return self.tensor_parallel * self.data_parallel if self.data_parallel > 1 else 1

    def replica_max_num_seqs(self, max_num_seqs: int) -> int:
        """Sequences a replica runs at once: vLLM's --max-num-seqs applies to each data-parallel engine."""
        return max_num_seqs * self.data_parallel


@dataclass(frozen=True)
class PassTerms:
    """One pass's time by kernel family, seconds (arrays broadcast like the step's arguments)."""

    linear_s: Array  # projections, MLP or experts and LM head: weights streamed or tensor-bound
    decode_attention_s: Array  # decodes reading their KV cache
    prefill_attention_s: Array  # prompt chunks attending over themselves and their prefix
    allreduce_s: Array  # tensor-parallel all-reduces

    @property
    def total_s(self) -> Array:
        total: Array = self.linear_s + self.decode_attention_s + self.prefill_attention_s + self.allreduce_s
        return total


@dataclass(frozen=True)
class ReplicaModel:
    """Precomputed per-rank constants of a ServingSetup and the step-time roofline over them."""

    setup: ServingSetup
    always_read_bytes: float  # per rank, per step
    routed_expert_bytes: float  # one expert of one layer, per rank
    linear_flops_per_token: float  # per rank, LM head excluded
    lm_head_flops_per_token: float  # per rank
    expert_flops_per_token: float  # per rank, the k active experts of all MoE layers
    attention_flops_per_token_pair: float  # per rank: QK^T and AV for one (query, key) pair, all layers
    kv_bytes_per_token_per_layer: float  # per rank
    linear_flops_per_s: float
    attention_flops_per_s: float
    gemm_calls_per_pass: float  # GEMM kernels of one pass through every layer, each paying a fixed cost
    # Routed experts: the share of the dense compute rate their sliced GEMMs reach (1 for dense models).
    expert_compute_share: float = 1.0

    @property
    def arch(self) -> ModelArchitecture:
        return self.setup.arch

    def _experts_touched_per_layer(self, tokens: Array) -> Array:
        """Expected distinct experts a batch of `tokens` routes to (uniform top-k routing)."""
        arch = self.arch
        if not arch.is_moe:
            return np.zeros_like(tokens)
        miss = (1.0 - arch.num_experts_per_token / arch.num_experts) ** tokens
        return arch.num_experts * (1.0 - miss)

    def weight_bytes_per_pass(self, routed_tokens: ArrayLike) -> Array:
        """Weight bytes one pass reads per rank: the dense weights, and the experts `routed_tokens` touch."""
        routed = np.asarray(routed_tokens, dtype=np.float64)
        experts = self._experts_touched_per_layer(routed) * self.arch.num_moe_layers
        return self.always_read_bytes + experts * self.routed_expert_bytes

    def effective_context(self, context_tokens: ArrayLike) -> Array:
        """Layer-averaged attended context: sliding-window layers stop at their window."""
        ctx = np.asarray(context_tokens, dtype=np.float64)
        arch = self.arch
        if not arch.num_sliding_layers:
            return ctx
        sliding = np.minimum(ctx, float(arch.sliding_window_tokens))
        mixed: Array = (arch.num_full_attention_layers * ctx + arch.num_sliding_layers * sliding) / arch.num_layers
        return mixed

    def step_s(
        self,
        decode_seqs: ArrayLike,
        context_tokens: ArrayLike,
        prefill_tokens: ArrayLike = 0.0,
        prefill_attention_pairs: ArrayLike = 0.0,
        prefill_seqs: ArrayLike = 0.0,
    ) -> Array:
        """Duration of one engine step, seconds.

        decode_seqs sequences each decode one token at a mean cache length of `context_tokens`;
        `prefill_tokens` prompt tokens of `prefill_seqs` sequences are computed in the same step,
        attending over `prefill_attention_pairs` (query, key) pairs in total (causal: L²/2 for a
        whole prompt of L). With pipeline parallel, the cycle of PP micro-batches (module docstring).
        """
        eff = self.setup.efficiency
        decode = np.asarray(decode_seqs, dtype=np.float64)
        engines = self.setup.data_parallel
        if engines > 1:
            return self._data_parallel_step_s(decode, context_tokens, prefill_tokens, prefill_attention_pairs,
                                              prefill_seqs) + eff.step_overhead_s
        stages = self.setup.pipeline_parallel
        if stages <= 1:
            return self._pass_s(decode, context_tokens, prefill_tokens, prefill_attention_pairs,
                                prefill_seqs) + eff.step_overhead_s
        micro = np.where(decode > 0, np.maximum(decode / stages, np.minimum(decode, 1.0)), 0.0)
        heaviest = micro + np.asarray(prefill_tokens, dtype=np.float64)
        passing = self._pass_s(micro, context_tokens, prefill_tokens, prefill_attention_pairs, prefill_seqs)
        boundary = estimate_stage_transfer_s(self.setup.gpu, self.arch.hidden_size, heaviest, ACTIVATION_BYTES, eff)
        # PP-1 hand-offs of hidden states, and the sampled tokens' way back to the first stage (latency only).
        transfer = (stages - 1) * boundary + np.where(heaviest > 0, eff.stage_transfer_latency_s, 0.0)
        return passing + transfer + eff.step_overhead_s

    def _data_parallel_step_s(self, decode: Array, context_tokens: ArrayLike, prefill_tokens: ArrayLike,
                              prefill_attention_pairs: ArrayLike, prefill_seqs: ArrayLike) -> Array:
        """The replica's batch over its D engines, paced by the busiest (module docstring)."""
        engines = float(self.setup.data_parallel)
        prefill = np.asarray(prefill_tokens, dtype=np.float64)
        prompts = np.asarray(prefill_seqs, dtype=np.float64)
        # The busiest engine: its share of the decodes (at least one while any run) and the prompt tokens
        # of one prompt, or an even share when more prompts than engines are in the step.
        busiest_decode = np.where(decode > 0, np.maximum(decode / engines, np.minimum(decode, 1.0)), 0.0)
        share = np.where(prefill > 0, 1.0 / np.clip(prompts, 1.0, engines), 0.0)
        busiest_prefill = prefill * share
        passing = self._pass_s(busiest_decode, context_tokens, busiest_prefill,
                               np.asarray(prefill_attention_pairs, dtype=np.float64) * share,
                               prompts * share, expert_tokens=decode + prefill)
        setup = self.setup
        hidden_bytes = self.arch.hidden_size * ACTIVATION_BYTES * self.arch.num_experts_per_token
        # Each TP rank of an engine dispatches its 1/TP of the engine's tokens.
        exchange = estimate_all_to_all_s(setup.gpu, setup.expert_parallel, setup.gpus_per_node,
                                         (busiest_decode + busiest_prefill) / setup.tensor_parallel,
                                         hidden_bytes, setup.efficiency)
        all_to_all: Array = self.arch.num_moe_layers * ALL_TO_ALLS_PER_MOE_LAYER * exchange
        return passing + all_to_all

    def _pass_s(self, decode: Array, context_tokens: ArrayLike, prefill_tokens: ArrayLike,
                prefill_attention_pairs: ArrayLike, prefill_seqs: ArrayLike,
                expert_tokens: ArrayLike | None = None) -> Array:
        """One batch through every layer on TP ranks, without the per-step overhead. `expert_tokens`: the
        tokens every engine routes to the experts (data parallel; default: this batch's)."""
        return self.pass_terms(decode, context_tokens, prefill_tokens, prefill_attention_pairs, prefill_seqs,
                               expert_tokens).total_s

    def pass_terms(self, decode_seqs: ArrayLike, context_tokens: ArrayLike, prefill_tokens: ArrayLike = 0.0,
                   prefill_attention_pairs: ArrayLike = 0.0, prefill_seqs: ArrayLike = 0.0,
                   expert_tokens: ArrayLike | None = None) -> PassTerms:
        """The kernel families of one pass through every layer on TP ranks, each its own roofline (the
        per-step overhead, pipeline and data-parallel terms left out): what a measured kernel is set against."""
        eff = self.setup.efficiency
        gpu = self.setup.gpu
        arch = self.arch
        decode = np.asarray(decode_seqs, dtype=np.float64)
        prefill = np.asarray(prefill_tokens, dtype=np.float64)
        tokens = decode + prefill
        routed = tokens if expert_tokens is None else np.asarray(expert_tokens, dtype=np.float64)
        bandwidth = gpu.hbm_bandwidth_bytes_per_s

        weight_bytes = self.weight_bytes_per_pass(routed)
        logit_rows = decode + np.minimum(np.asarray(prefill_seqs, dtype=np.float64), prefill)
        # Routed-expert work per GPU: the group's tokens spread over its D x TP GPUs (as tokens / TP without DP).
        expert_share = routed / self.setup.data_parallel
        # Expert FLOPs weighted by the rate their narrow slices reach, as dense-rate equivalents.
        linear_flops = (tokens * self.linear_flops_per_token
                        + expert_share * self.expert_flops_per_token / self.expert_compute_share
                        + logit_rows * self.lm_head_flops_per_token)
        streaming = bandwidth * eff.hbm_bandwidth * gpu.weight_streaming_scale
        fixed_s = self.gemm_calls_per_pass * eff.gemm_fixed_s + arch.num_moe_layers * eff.moe_call_fixed_s
        linear_s = (np.maximum(weight_bytes / streaming, linear_flops / (self.linear_flops_per_s * eff.compute))
                    + np.where(tokens > 0, fixed_s, 0.0))

        ctx = self.effective_context(context_tokens)
        kv_bytes = decode * ctx * self.kv_bytes_per_token_per_layer * arch.num_layers
        decode_attention_flops = decode * ctx * self.attention_flops_per_token_pair
        decode_attention_s = np.maximum(kv_bytes / (bandwidth * eff.attention_bandwidth),
                                        decode_attention_flops / (self.attention_flops_per_s * eff.compute))
        prefill_attention_s = (np.asarray(prefill_attention_pairs, dtype=np.float64)
                               * self.attention_flops_per_token_pair / (self.attention_flops_per_s * eff.compute))

        message = tokens * arch.hidden_size * ACTIVATION_BYTES
        comm_s = arch.num_layers * ALLREDUCES_PER_LAYER * estimate_allreduce_s(
            gpu, self.setup.tensor_parallel, message, eff)
        comm_s = np.where(tokens > 0, comm_s, 0.0)
        return PassTerms(linear_s=linear_s, decode_attention_s=decode_attention_s,
                         prefill_attention_s=prefill_attention_s, allreduce_s=comm_s)

    def decode_step_s(self, batch: ArrayLike, context_tokens: ArrayLike) -> Array:
        return self.step_s(batch, context_tokens)

    def prefill_s(self, prompt_tokens: ArrayLike, prompts: ArrayLike = 1.0) -> Array:
        """Time to prefill `prompts` prompts of `prompt_tokens` each, alone, in token-budget chunks."""
        length = np.asarray(prompt_tokens, dtype=np.float64)
        count = np.asarray(prompts, dtype=np.float64)
        total = length * count
        chunks = np.maximum(1.0, np.ceil(total / self.setup.token_budget))
        pairs = count * length * length / 2.0
        per_chunk = self.step_s(0.0, 0.0, total / chunks, pairs / chunks, count / chunks)
        return chunks * per_chunk


def gemm_calls_per_pass(arch: ModelArchitecture) -> int:
    """GEMM kernels of one decode pass (vLLM fuses Q, K and V into one, gate and up into another). MLA: the
    query's down and up projections, the latent KV projection, the two absorbed per-head products and the
    output. A MoE layer's router and shared expert are GEMMs; its fused routed-expert kernel is not counted
    here: it pays its own fixed cost (EfficiencyFactors.moe_call_fixed_s)."""
    attention = 6 if arch.is_mla else 2
    moe_layers = arch.num_moe_layers
    moe = 1 + (2 if arch.num_shared_experts else 0)  # the router, the shared expert's two
    return arch.num_layers * attention + (arch.num_layers - moe_layers) * 2 + moe_layers * moe + 1  # + LM head


def build_replica_model(setup: ServingSetup) -> ReplicaModel:
    arch = setup.arch
    tp = setup.tensor_parallel
    counts = compute_parameter_counts(arch)
    weights = compute_weight_bytes(arch, setup.precision)
    dense_linear = counts.attention + counts.dense_ffn + counts.shared_experts + counts.router
    lm_head = counts.lm_head or counts.embedding
    if arch.is_mla:
        # Absorbed MLA: scores and values in the latent space (kv_lora_rank + rope dims) per head.
        per_pair = 2 * arch.num_attention_heads * (2 * arch.kv_lora_rank + arch.qk_rope_head_dim) * arch.num_layers
    else:
        per_pair = 4 * arch.num_attention_heads * arch.head_dim * arch.num_layers
    return ReplicaModel(
        setup=setup,
        always_read_bytes=weights.always_read / tp,
        routed_expert_bytes=weights.routed_expert / setup.expert_parallel if setup.data_parallel > 1
        else weights.routed_expert / tp,
        linear_flops_per_token=2.0 * dense_linear / tp,
        lm_head_flops_per_token=2.0 * lm_head / tp,
        expert_flops_per_token=2.0 * arch.num_moe_layers * arch.num_experts_per_token * counts.routed_expert_size / tp,
        attention_flops_per_token_pair=per_pair / tp,
        kv_bytes_per_token_per_layer=kv_bytes_per_token_per_layer(arch, setup.kv_cache_dtype, tp),
        linear_flops_per_s=linear_flops_per_s(setup.gpu, setup.precision),
        attention_flops_per_s=setup.gpu.bf16_flops_per_s,
        gemm_calls_per_pass=float(gemm_calls_per_pass(arch)),
        # With data-parallel engines (expert parallel) each GPU holds whole experts; else slices of TP.
        expert_compute_share=setup.efficiency.expert_compute_share(
            arch.moe_intermediate_size / (1 if setup.data_parallel > 1 else tp)) if arch.is_moe else 1.0,
    )


def compute_replica_kv_capacity(setup: ServingSetup, max_num_seqs: int,
                                context_tokens: float | None = None) -> KvCapacity:
    """What a replica caches; `max_num_seqs` is the engine flag. With data-parallel engines the bytes
    are one engine's rank's and `tokens` the replica's (every engine's cache)."""
    engine = compute_kv_capacity(
        setup.arch,
        setup.gpu.memory_bytes,
        setup.precision,
        setup.kv_cache_dtype,
        setup.tensor_parallel,
        setup.gpu_memory_utilization,
        setup.engine_token_budget,
        max_num_seqs,
        context_tokens,
        setup.pipeline_parallel,
        setup.data_parallel,
    )
    return replace(engine, tokens=engine.tokens * setup.data_parallel)


def replica_weights_bytes_per_gpu(setup: ServingSetup) -> float:
    return weights_bytes_per_gpu(setup.arch, setup.precision, setup.tensor_parallel, setup.pipeline_parallel,
                                 setup.data_parallel)

"""Parameter counts, weight bytes and KV-cache sizing, the way vLLM sizes its cache.

All results are bytes or counts; per-GPU figures are for one tensor-parallel rank.

Pipeline parallel (`pipeline_parallel` > 1, a replica over several nodes): vLLM gives each stage a
contiguous run of ceil-or-floor(L / PP) decoder layers; the first stage also holds the embedding and
the last the LM head. Per-GPU figures are for the largest stage: ceil(L / PP) layers plus the larger
of the embedding and the head (conservative by one of them at most), and the KV cache of its layers.

Data-parallel attention with expert parallelism (`data_parallel` > 1, MoE models; vLLM
`--data-parallel-size D --enable-expert-parallel`): each of the D engines holds the whole non-expert
model (sharded over its own TP ranks) and its own KV cache; the routed experts are split whole over all
D x TP GPUs (the expert-parallel group), not sharded within them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscale.api.spec import KvCacheDtype, Precision
from kvscale.catalog.architecture import ModelArchitecture
from kvscale.perfmodel.precision import (
    UNQUANTIZED_BYTES_PER_PARAM,
    WEIGHT_BYTES_PER_PARAM,
    kv_bytes_per_element,
)
from kvscale.units import GIB

VLLM_BLOCK_SIZE_TOKENS = 16
# Non-torch memory (CUDA context, cuBLAS workspaces) and CUDA graphs, as vLLM's profiler sees them.
RUNTIME_RESERVE_BYTES = int(1.0 * GIB)
NCCL_RESERVE_BYTES = int(0.25 * GIB)
FP32_BYTES = 4


def replayed_prompt_hit_rate(prompt_tokens: float, block_size_tokens: int = VLLM_BLOCK_SIZE_TOKENS) -> float:
    """Share of a prompt the prefix cache serves when the cache already holds that very prompt (a
    benchmark sweep that replays its prompts, a retried request). vLLM hashes full blocks only and
    recomputes the last prompt token for its logits, so it serves every full block below the last
    token: the rest, 1 to `block_size_tokens` tokens, 8.5 on average for 16-token blocks over lengths
    spread evenly across a block."""
    if prompt_tokens <= 0:
        return 0.0
    computed = min(prompt_tokens, (1.0 + block_size_tokens) / 2.0)
    return 1.0 - computed / prompt_tokens


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters by role, for the whole model (all TP ranks together)."""

    embedding: int
    lm_head: int
    attention: int  # every layer's attention projections
    dense_ffn: int  # dense FFN layers (all layers of a dense model)
    routed_experts: int  # all routed experts of all MoE layers
    shared_experts: int
    router: int
    routed_expert_size: int  # one expert in one layer
    norms: int

    @property
    def total(self) -> int:
        return (self.embedding + self.lm_head + self.attention + self.dense_ffn + self.routed_experts
                + self.shared_experts + self.router + self.norms)


def attention_params_per_layer(arch: ModelArchitecture) -> int:
    h = arch.hidden_size
    if arch.is_mla:
        qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        if arch.q_lora_rank:
            q = h * arch.q_lora_rank + arch.q_lora_rank * arch.num_attention_heads * qk_head
        else:
            q = h * arch.num_attention_heads * qk_head
        kv_down = h * (arch.kv_lora_rank + arch.qk_rope_head_dim)
        kv_up = arch.kv_lora_rank * arch.num_attention_heads * (arch.qk_nope_head_dim + arch.v_head_dim)
        out = arch.num_attention_heads * arch.v_head_dim * h
        return q + kv_down + kv_up + out
    q_width = arch.num_attention_heads * arch.head_dim
    kv_width = arch.num_kv_heads * arch.head_dim
    return h * q_width + 2 * h * kv_width + q_width * h


def compute_parameter_counts(arch: ModelArchitecture) -> ParameterCounts:
    h = arch.hidden_size
    gated_ffn = 3 * h  # gate, up and down projections
    expert = gated_ffn * arch.moe_intermediate_size if arch.is_moe else 0
    dense_layers = arch.num_dense_layers if arch.is_moe else arch.num_layers
    return ParameterCounts(
        embedding=arch.vocab_size * h,
        lm_head=0 if arch.tie_word_embeddings else arch.vocab_size * h,
        attention=arch.num_layers * attention_params_per_layer(arch),
        dense_ffn=dense_layers * gated_ffn * arch.intermediate_size,
        routed_experts=arch.num_moe_layers * arch.num_experts * expert,
        shared_experts=arch.num_moe_layers * arch.num_shared_experts * expert,
        router=arch.num_moe_layers * h * arch.num_experts,
        routed_expert_size=expert,
        norms=arch.num_layers * 2 * h + h,
    )


def _non_expert_linear_bytes_per_param(precision: Precision, arch: ModelArchitecture) -> float:
    # mxfp4 checkpoints (gpt-oss) quantize only the MoE experts; attention stays 16-bit.
    if precision is Precision.MXFP4 and arch.is_moe:
        return UNQUANTIZED_BYTES_PER_PARAM
    return WEIGHT_BYTES_PER_PARAM[precision]


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes by how they are read in a decode step."""

    always_read: float  # attention, dense FFN, shared experts, router, LM head (per step, whole model)
    embedding: float  # looked up row by row, never streamed
    routed_expert: float  # one routed expert of one layer

    def total(self, arch: ModelArchitecture) -> float:
        return self.always_read + self.embedding + self.routed_expert * arch.num_moe_layers * arch.num_experts


def compute_weight_bytes(arch: ModelArchitecture, precision: Precision) -> WeightBytes:
    counts = compute_parameter_counts(arch)
    linear = _non_expert_linear_bytes_per_param(precision, arch)
    lm_head = counts.lm_head if counts.lm_head else counts.embedding  # tied: the embedding is read as head
    always = (counts.attention + counts.dense_ffn + counts.shared_experts) * linear + (
        counts.router + counts.norms + lm_head
    ) * UNQUANTIZED_BYTES_PER_PARAM
    embedding = 0.0 if arch.tie_word_embeddings else counts.embedding * UNQUANTIZED_BYTES_PER_PARAM
    return WeightBytes(
        always_read=always,
        embedding=embedding,
        routed_expert=counts.routed_expert_size * WEIGHT_BYTES_PER_PARAM[precision],
    )


def kv_heads_per_rank(arch: ModelArchitecture, tensor_parallel: int) -> int:
    """vLLM shards KV heads across ranks and replicates them when TP exceeds their number."""
    return max(1, arch.num_kv_heads // tensor_parallel)


def kv_bytes_per_token_per_layer(arch: ModelArchitecture, kv_cache_dtype: KvCacheDtype,
                                 tensor_parallel: int = 1) -> int:
    element = kv_bytes_per_element(kv_cache_dtype)
    if arch.is_mla:
        # One latent (compressed KV + decoupled RoPE key) per token, replicated on every rank.
        return (arch.kv_lora_rank + arch.qk_rope_head_dim) * element
    heads = arch.num_kv_heads if tensor_parallel == 1 else kv_heads_per_rank(arch, tensor_parallel)
    return 2 * heads * arch.head_dim * element


def kv_bytes_per_token(arch: ModelArchitecture, kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO,
                       tensor_parallel: int = 1) -> int:
    """Bytes one token adds to the cache across all layers (sliding layers counted as full layers).

    With tensor_parallel > 1 this is the per-rank figure.
    """
    return arch.num_layers * kv_bytes_per_token_per_layer(arch, kv_cache_dtype, tensor_parallel)


def kv_bytes_per_sequence(arch: ModelArchitecture, context_tokens: float, kv_cache_dtype: KvCacheDtype,
                          tensor_parallel: int = 1) -> float:
    """Cache bytes a sequence of `context_tokens` holds: sliding-window layers keep only their window."""
    per_layer = kv_bytes_per_token_per_layer(arch, kv_cache_dtype, tensor_parallel)
    full = arch.num_full_attention_layers * per_layer * context_tokens
    sliding = arch.num_sliding_layers * per_layer * min(context_tokens, arch.sliding_window_tokens)
    return full + sliding


def stage_layer_share(arch: ModelArchitecture, pipeline_parallel: int = 1) -> float:
    """Share of the decoder layers the largest pipeline stage holds: ceil(L / PP) / L (1 without PP)."""
    if pipeline_parallel <= 1:
        return 1.0
    return math.ceil(arch.num_layers / pipeline_parallel) / arch.num_layers


def weights_bytes_per_gpu(arch: ModelArchitecture, precision: Precision, tensor_parallel: int,
                          pipeline_parallel: int = 1, data_parallel: int = 1) -> float:
    """Weights one rank holds: everything is sharded across TP except replicated KV projections; with
    PP, the largest stage's layers plus the larger of the embedding and the LM head; with data-parallel
    attention and expert parallelism, the routed experts over all D x TP GPUs."""
    weights = compute_weight_bytes(arch, precision)
    total = weights.total(arch)
    if data_parallel > 1:
        # Whole experts per GPU (EP shards experts, not their matrices): the routed share is E / (D x TP).
        routed = weights.routed_expert * arch.num_moe_layers * arch.num_experts
        total -= routed * (1.0 - 1.0 / data_parallel)
    share = stage_layer_share(arch, pipeline_parallel)
    if pipeline_parallel > 1:
        counts = compute_parameter_counts(arch)
        head = (counts.lm_head or counts.embedding) * UNQUANTIZED_BYTES_PER_PARAM
        ends = head + weights.embedding
        total = (total - ends) * share + max(head, weights.embedding)
    sharded = total / tensor_parallel
    if not arch.is_mla and tensor_parallel > arch.num_kv_heads:
        kv_proj = 2 * arch.hidden_size * arch.head_dim * arch.num_layers
        replicated_heads = kv_heads_per_rank(arch, tensor_parallel) - arch.num_kv_heads / tensor_parallel
        sharded += kv_proj * replicated_heads * _non_expert_linear_bytes_per_param(precision, arch) * share
    return sharded


def activation_peak_bytes(arch: ModelArchitecture, tensor_parallel: int, max_num_batched_tokens: int,
                          max_num_seqs: int) -> float:
    """Peak activation memory of vLLM's profiling forward pass at the full token budget.

    Hidden states and the widest FFN intermediate for every token in the budget (16-bit), plus
    fp32 logits for every sequence the sampler may see.
    """
    ffn_width = arch.moe_intermediate_size * arch.num_experts_per_token if arch.is_moe else arch.intermediate_size
    ffn_width = max(ffn_width, arch.intermediate_size if not arch.is_moe or arch.num_dense_layers else 0)
    per_token = (4 * arch.hidden_size + 2 * ffn_width / tensor_parallel) * 2
    logits = max_num_seqs * arch.vocab_size / tensor_parallel * FP32_BYTES
    return max_num_batched_tokens * per_token + logits


@dataclass(frozen=True)
class KvCapacity:
    """What one replica can cache, per rank."""

    usable_bytes: float  # memory left for the KV cache on each rank (negative: weights do not fit)
    weights_bytes: float
    activation_bytes: float
    reserve_bytes: float
    tokens: int  # full-context tokens the cache holds (block-rounded), 0 when nothing fits

    @property
    def fits(self) -> bool:
        return self.tokens > 0


def compute_kv_capacity(
    arch: ModelArchitecture,
    memory_bytes: int,
    precision: Precision,
    kv_cache_dtype: KvCacheDtype,
    tensor_parallel: int,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    context_tokens: float | None = None,
    pipeline_parallel: int = 1,
    data_parallel: int = 1,
) -> KvCapacity:
    """KV-cache capacity in tokens of one replica, following vLLM's `determine_available_memory`.

    `context_tokens` sets the sequence length used to amortise sliding-window layers (their cache
    stops growing at the window); without it every layer is treated as full attention. With
    `pipeline_parallel` > 1, the figures are those of a rank of the largest stage, whose cache holds
    its own layers of every token (so the replica holds PP times the tokens of one stage's share).
    With `data_parallel` > 1, the figures are those of one engine (its own cache, `max_num_seqs` and token
    budget its own), whose GPUs hold E / (D x TP) of the routed experts.
    """
    weights = weights_bytes_per_gpu(arch, precision, tensor_parallel, pipeline_parallel, data_parallel)
    activation = activation_peak_bytes(arch, tensor_parallel, max_num_batched_tokens, max_num_seqs)
    communicates = tensor_parallel > 1 or pipeline_parallel > 1 or data_parallel > 1
    reserve = RUNTIME_RESERVE_BYTES + (NCCL_RESERVE_BYTES if communicates else 0)
    usable = math.ceil(memory_bytes * gpu_memory_utilization) - weights - activation - reserve
    if context_tokens:
        per_token: float = kv_bytes_per_sequence(arch, context_tokens, kv_cache_dtype, tensor_parallel) / context_tokens
    else:
        per_token = kv_bytes_per_token(arch, kv_cache_dtype, tensor_parallel)
    if pipeline_parallel > 1:
        per_token *= stage_layer_share(arch, pipeline_parallel)
    blocks = max(0, int(usable // (per_token * VLLM_BLOCK_SIZE_TOKENS)) - 1)  # one null block
    return KvCapacity(
        usable_bytes=usable,
        weights_bytes=weights,
        activation_bytes=activation,
        reserve_bytes=reserve,
        tokens=blocks * VLLM_BLOCK_SIZE_TOKENS,
    )


def max_model_len_that_fits(arch: ModelArchitecture, capacity: KvCapacity, kv_cache_dtype: KvCacheDtype,
                            tensor_parallel: int, pipeline_parallel: int = 1) -> int:
    """Longest single request whose cache fits (vLLM refuses to start below one max-length request)."""
    if capacity.usable_bytes <= 0:
        return 0
    per_layer: float = kv_bytes_per_token_per_layer(arch, kv_cache_dtype, tensor_parallel)
    if pipeline_parallel > 1:
        per_layer *= stage_layer_share(arch, pipeline_parallel)
    full_per_token = arch.num_full_attention_layers * per_layer
    sliding_bytes = arch.num_sliding_layers * per_layer * arch.sliding_window_tokens
    budget = capacity.usable_bytes - sliding_bytes
    if full_per_token == 0:
        return arch.max_context_tokens if budget > 0 else 0
    tokens = int(budget // full_per_token)
    return max(0, tokens // VLLM_BLOCK_SIZE_TOKENS * VLLM_BLOCK_SIZE_TOKENS - VLLM_BLOCK_SIZE_TOKENS)

"""Which configurations are worth evaluating: legal TP degrees and the max-num-seqs grid."""

from __future__ import annotations

from kvscale.catalog.architecture import ModelArchitecture

TENSOR_PARALLEL_DEGREES = (1, 2, 4, 8, 16)
MAX_NUM_SEQS_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def tensor_parallel_is_legal(arch: ModelArchitecture, tensor_parallel: int) -> bool:
    """vLLM needs attention heads divisible by TP and KV heads either divisible by TP or dividing it."""
    if arch.num_attention_heads % tensor_parallel:
        return False
    if arch.is_mla:
        return True
    kv = arch.num_kv_heads
    return kv % tensor_parallel == 0 or tensor_parallel % kv == 0


def tensor_parallel_options(arch: ModelArchitecture, gpus_per_node: int, pinned: int | None) -> list[int]:
    degrees = (pinned,) if pinned else TENSOR_PARALLEL_DEGREES
    return [tp for tp in degrees if tp <= gpus_per_node and tensor_parallel_is_legal(arch, tp)]


def max_num_seqs_options(token_budget: int, pinned: int | None) -> list[int]:
    """Batch caps to try; vLLM requires max_num_batched_tokens >= max_num_seqs."""
    grid = (pinned,) if pinned else MAX_NUM_SEQS_GRID
    return [b for b in grid if b <= token_budget]

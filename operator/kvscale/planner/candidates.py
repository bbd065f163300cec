"""Which configurations are worth evaluating: legal TP and PP degrees and the max-num-seqs grid."""

from __future__ import annotations

from kvscale.catalog.architecture import ModelArchitecture

TENSOR_PARALLEL_DEGREES = (1, 2, 4, 8, 16)
# Nodes per replica when a replica spans nodes: TP fills each node, PP stages run across them.
PIPELINE_PARALLEL_DEGREES = (1, 2, 3, 4)
# Data-parallel engines per replica (MoE models, expert parallel over all their GPUs): within a node, or
# whole nodes of them (at most MAX_DATA_PARALLEL_NODES).
DATA_PARALLEL_DEGREES = (2, 4, 8, 16, 32, 64)
MAX_DATA_PARALLEL_NODES = 4
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


def parallel_layouts(arch: ModelArchitecture, gpus_per_node: int, pinned_tp: int | None,
                     pinned_pp: int | None) -> list[tuple[int, int]]:
    """(TP, PP) pairs to evaluate: every legal TP within one node without PP, and replicas of whole
    nodes (TP = the largest legal degree within a node) over 2-4 nodes by pipeline parallel. A pinned
    TP below that spans nodes only when PP is pinned too; each stage needs at least one layer."""
    tps = tensor_parallel_options(arch, gpus_per_node, pinned_tp)
    whole_node = tensor_parallel_options(arch, gpus_per_node, None)
    pps = (pinned_pp,) if pinned_pp else PIPELINE_PARALLEL_DEGREES
    layouts: list[tuple[int, int]] = []
    for pp in pps:
        if pp == 1:
            layouts += [(tp, 1) for tp in tps]
        elif tps and pp <= arch.num_layers and (pinned_pp or max(tps) == max(whole_node)):
            layouts.append((max(tps), pp))
    return layouts


def data_parallel_layouts(arch: ModelArchitecture, gpus_per_node: int, pinned_tp: int | None,
                          pinned_dp: int | None) -> list[tuple[int, int]]:
    """(TP, DP) pairs for data-parallel attention with expert parallelism (MoE models only): D engines of
    TP GPUs each filling one whole node or 2-4 whole nodes (vLLM places DP ranks node by node). A pinned
    DP may also fill part of a node."""
    if not arch.is_moe or pinned_dp == 1:
        return []
    layouts = []
    for tp in tensor_parallel_options(arch, gpus_per_node, pinned_tp):
        for dp in (pinned_dp,) if pinned_dp else DATA_PARALLEL_DEGREES:
            gpus = tp * dp
            within = gpus == gpus_per_node or (pinned_dp is not None and gpus < gpus_per_node)
            whole_nodes = gpus % gpus_per_node == 0 and gpus // gpus_per_node <= MAX_DATA_PARALLEL_NODES
            if within or whole_nodes:
                layouts.append((tp, dp))
    return layouts

"""Communication: tensor-parallel ring all-reduce over NVLink, xGMI or PCIe, and pipeline-parallel
hand-offs of hidden states between nodes."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvscale.catalog.gpus import GpuSpec
from kvscale.perfmodel.efficiency import EfficiencyFactors

ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP / MoE block


def estimate_allreduce_s(gpu: GpuSpec, tensor_parallel: int, message_bytes: ArrayLike,
                         efficiency: EfficiencyFactors) -> NDArray[np.float64]:
    """One ring all-reduce: 2(n-1)/n of the message crosses each link, plus a fixed call latency."""
    size = np.asarray(message_bytes, dtype=np.float64)
    if tensor_parallel <= 1:
        return np.zeros_like(size)
    latency = efficiency.pcie_allreduce_latency_s if gpu.interconnect == "pcie" else efficiency.allreduce_latency_s
    traffic = 2.0 * (tensor_parallel - 1) / tensor_parallel * size
    return latency + traffic / (gpu.interconnect_bytes_per_s * efficiency.interconnect)


# What crosses a pipeline stage boundary per token: vLLM's IntermediateTensors for the decoder
# models it serves carry the hidden states and the residual, both 16-bit.
STAGE_TENSORS_PER_TOKEN = 2


def estimate_stage_transfer_s(gpu: GpuSpec, hidden_size: int, tokens: ArrayLike, activation_bytes: int,
                              efficiency: EfficiencyFactors) -> NDArray[np.float64]:
    """One pipeline stage boundary: the micro-batch's hidden states (and residual) sent from each rank
    of one stage to its peer in the next node over that GPU's share of the inter-node network (each
    rank sends the whole tensor: assumed, vLLM's all-gather variant would send 1/TP), plus a fixed
    per-boundary cost."""
    count = np.asarray(tokens, dtype=np.float64)
    size = count * hidden_size * activation_bytes * STAGE_TENSORS_PER_TOKEN
    bandwidth = gpu.inter_node_bytes_per_s * efficiency.inter_node
    if bandwidth <= 0:
        raise ValueError(f"{gpu.name} has no inter-node bandwidth: a replica cannot span nodes")
    return np.where(count > 0, efficiency.stage_transfer_latency_s + size / bandwidth, 0.0)


# Expert parallelism: every MoE layer sends each token's hidden state to the GPUs of its top-k experts
# (dispatch) and their outputs back (combine).
ALL_TO_ALLS_PER_MOE_LAYER = 2


def estimate_all_to_all_s(gpu: GpuSpec, expert_parallel: int, gpus_per_node: int, tokens: ArrayLike,
                          bytes_per_token: float, efficiency: EfficiencyFactors) -> NDArray[np.float64]:
    """One expert-parallel all-to-all: each of a GPU's `tokens` sends `bytes_per_token` (its hidden state to
    every chosen expert) to the GPUs holding them, spread evenly over the `expert_parallel` group. What goes
    to GPUs of the same node crosses NVLink, the rest the GPU's share of the inter-node network; both run
    at once, so the slower one counts, plus the call's fixed cost (a node boundary's where the group spans
    nodes)."""
    count = np.asarray(tokens, dtype=np.float64)
    if expert_parallel <= 1:
        return np.zeros_like(count)
    local = min(expert_parallel, max(gpus_per_node, 1))
    size = count * bytes_per_token
    within = size * (local - 1) / expert_parallel / (gpu.interconnect_bytes_per_s * efficiency.interconnect)
    latency = efficiency.pcie_allreduce_latency_s if gpu.interconnect == "pcie" else efficiency.allreduce_latency_s
    if expert_parallel > local:
        bandwidth = gpu.inter_node_bytes_per_s * efficiency.inter_node
        if bandwidth <= 0:
            raise ValueError(f"{gpu.name} has no inter-node bandwidth: an expert-parallel group cannot span nodes")
        across = size * (expert_parallel - local) / expert_parallel / bandwidth
        latency = efficiency.stage_transfer_latency_s
    else:
        across = np.zeros_like(size)
    return np.where(count > 0, latency + np.maximum(within, across), 0.0)

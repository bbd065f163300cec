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

"""Tensor-parallel communication: ring all-reduce over NVLink, xGMI or PCIe."""

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

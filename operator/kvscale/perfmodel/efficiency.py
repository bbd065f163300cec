"""Efficiency factors: how far real kernels fall short of datasheet peaks. Calibration fits these."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EfficiencyFactors:
    """Multipliers on datasheet peaks plus fixed costs. Defaults are fitted to published measurements
    (see docs/accuracy.md); the operator refits them per deployment from live metrics."""

    hbm_bandwidth: float = 0.80  # achieved / peak HBM bandwidth for weight and KV streaming
    compute: float = 0.60  # achieved / peak dense tensor throughput (prefill, large-batch decode)
    interconnect: float = 0.70  # achieved / peak link bandwidth in all-reduce
    allreduce_latency_s: float = 12e-6  # fixed cost of one all-reduce call over NVLink/xGMI
    pcie_allreduce_latency_s: float = 30e-6  # the same over PCIe
    step_overhead_s: float = 1.5e-3  # scheduler, sampling, launch per engine step
    attention_bandwidth: float = 0.70  # achieved / peak HBM bandwidth when reading the KV cache

    def scaled(self, *, decode: float = 1.0, prefill: float = 1.0) -> EfficiencyFactors:
        """Factors with memory-bound work `decode` times faster and compute-bound work `prefill` times faster."""
        return replace(
            self,
            hbm_bandwidth=self.hbm_bandwidth * decode,
            attention_bandwidth=self.attention_bandwidth * decode,
            compute=self.compute * prefill,
        )


DEFAULT_EFFICIENCY = EfficiencyFactors()
